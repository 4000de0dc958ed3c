"""The sampler's latency sketch answers exactly as ddsketch.DDSketch (same mapping)."""

from __future__ import annotations

from ddsketch import DDSketch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentrace.collector.sketch import LatencySketch

positive = st.floats(min_value=1e-6, max_value=1e7, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(positive, min_size=1, max_size=400), st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0]))
def test_quantiles_match_ddsketch(values: list[float], q: float) -> None:
    reference = DDSketch(relative_accuracy=0.01)
    sketch = LatencySketch(0.01)
    for v in values:
        reference.add(v)
        sketch.add(v)
    assert sketch.count == len(values)
    assert sketch.quantile(q) == reference.get_quantile_value(q)


def test_empty_sketch_has_no_quantile() -> None:
    assert LatencySketch().quantile(0.99) is None
