// tokentrace explorer behaviour: overview charts (uPlot) and the waterfall (collapse, details).
// No inline scripts anywhere (the CSP forbids them); data arrives as JSON blocks.
(function () {
  "use strict";
  var COLORS = { p50: "#3d85c6", p90: "#6aa84f", p95: "#e69138", p99: "#cc0000",
                 network: "#8e7cc3", queue: "#e69138", prefill: "#3d85c6", decode: "#6aa84f" };

  // Durations read alike on every page. One value (legends) as web/_format.py `ms` gives it to
  // the cards and tables: "912.4 ms", from 1 s on "1.29 s" with one decimal more, switching on
  // the rounded figure. An axis says one unit for all its ticks, from its largest tick (ms under
  // 1 s, s from 1 s on), with the decimals its step needs: "0 ms 250 ms 500 ms", "0.5 s 1.0 s".
  var duration = (function () {
    // v with `digits` decimals and thousands commas, rounded as Python's format() rounds
    // (the exact binary value, an exact tie to even: 147.25 → "147.2", 318.45 → "318.4");
    // toLocaleString rounds the shortest decimal instead, and toFixed rounds ties up
    function fixed(v, digits) {
      var a = Math.abs(v), text = a.toFixed(digits), exact = a.toFixed(digits + 25);
      if (/50{24}$/.test(exact)) {
        var down = exact.slice(0, exact.length - 25 - (digits ? 0 : 1));
        if (Number(down.slice(-1)) % 2 === 0) text = down;
      }
      var parts = text.split(".");
      parts[0] = parts[0].replace(/\B(?=(\d{3})+(?!\d))/g, ",");
      return (v < 0 && Number(text) !== 0 ? "-" : "") + parts.join(".");
    }
    // fewest decimals that write `step` exactly (0.25 → 2, 50 → 0), at most 3
    function decimals(step) {
      for (var d = 0; d < 3; d++) {
        var scaled = Math.abs(step) * Math.pow(10, d);
        if (Math.abs(scaled - Math.round(scaled)) < 1e-6 * Math.max(1, scaled)) return d;
      }
      return 3;
    }
    return {
      text: function (ms, digits) {
        if (ms == null) return "—";
        digits = digits == null ? 1 : digits;
        if (Number(fixed(Math.abs(ms), digits).replace(/,/g, "")) < 1000) return fixed(ms, digits) + " ms";
        return fixed(ms / 1000, digits + 1) + " s";
      },
      axis: function (ticks, step) {
        var top = ticks.reduce(function (a, t) { return t == null ? a : Math.max(a, Math.abs(t)); }, 0);
        var per = top >= 1000 ? 1000 : 1, unit = per === 1000 ? " s" : " ms";
        var d = decimals(step / per);
        return ticks.map(function (t) { return t == null ? null : fixed(t / per, d) + unit; });
      },
    };
  })();

  function readJSON(id) {
    var el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }

  // Every other time on the pages is UTC ("…Z"): the charts say UTC too, not the browser's zone,
  // with uPlot's own tick layout but a 24-hour clock and ISO dates.
  function utc(ts) { return uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"); }
  var DAY = "{YYYY}-{MM}-{DD}", HM = "{HH}:{mm}";
  var TIME_TICKS = [
    [3600 * 24 * 365, "{YYYY}", null, null, null, null, null, null, 1],
    [3600 * 24 * 28, "{YYYY}-{MM}", "\n{YYYY}", null, null, null, null, null, 1],
    [3600 * 24, "{MM}-{DD}", "\n{YYYY}", null, null, null, null, null, 1],
    [3600, HM, "\n" + DAY, null, "\n{MM}-{DD}", null, null, null, 1],
    [60, HM, "\n" + DAY, null, "\n{MM}-{DD}", null, null, null, 1],
    [1, ":{ss}", "\n" + DAY + " " + HM, null, "\n{MM}-{DD} " + HM, null, "\n" + HM, null, 1],
    [0.001, ":{ss}.{fff}", "\n" + DAY + " " + HM, null, "\n{MM}-{DD} " + HM, null, "\n" + HM, null, 1],
  ];

  // A y axis as wide as its longest label: uPlot's fixed 50 px cut "10,000" down to "0,000".
  // It is also the room left of the x axis's first label, centred on the y axis, which
  // carries the date ("2026-01-01 00:00"): at least half of that.
  function axisSize(u, values, axisIdx, cycleNum) {
    var axis = u.axes[axisIdx];
    if (cycleNum > 1) return axis._size;  // uPlot asks again while it settles; keep the first answer
    var longest = (values || []).reduce(function (a, v) { return v != null && String(v).length > a.length ? String(v) : a; }, "");
    u.ctx.font = axis.font[0];
    var width = function (text) { return u.ctx.measureText(text).width / devicePixelRatio; };
    return Math.ceil(Math.max(axis.ticks.size + axis.gap + width(longest), width("0000-00-00 00:00") / 2)) + 4;
  }

  // Between two empty bins a bin is a lone point, which a line cannot draw: show it as a dot.
  function lonePoints(u, seriesIdx) {
    var d = u.data[seriesIdx], out = [];
    for (var i = 0; i < d.length; i++) {
      if (d[i] != null && d[i - 1] == null && d[i + 1] == null) out.push(i);
    }
    return out;
  }

  // The last bin with any value in the chart: what its legend shows while the pointer is off it.
  function latestIndex(u) {
    for (var i = u.data[0].length - 1; i >= 0; i--) {
      for (var k = 1; k < u.data.length; k++) if (u.data[k][i] != null) return i;
    }
    return null;
  }

  // A legend value: at the bin under the pointer, else at the latest bin with data ("--" read
  // like missing data). `format(v, seriesIdx, idx)` writes a value that is there.
  function legendValue(format) {
    return function (u, v, seriesIdx, idx) {
      if (idx == null) {
        idx = latestIndex(u);
        if (idx == null) return "—";
        v = u.data[seriesIdx][idx];
      }
      return v == null ? "—" : format(v, seriesIdx, idx);
    };
  }

  var stamp = uPlot.fmtDate(DAY + " {HH}:{mm}:{ss}");
  // the time's legend entry: the bin under the pointer, or the latest one, said so
  var timeValue = function (u, v, seriesIdx, idx) {
    var latest = idx == null;
    if (latest) idx = latestIndex(u);
    if (idx == null) return "—";
    return stamp(utc(u.data[0][idx])) + (latest ? " (latest)" : "");
  };

  // The x range of a chart: its bins; a window of one bin gets a slice either side of it
  // (uPlot would give one time a day on its own, drawn as years).
  function timeRange(binS) {
    return function (u, min, max) {
      var t = u.data[0];
      return t.length === 1 ? [t[0] - binS, t[0] + binS] : [min, max];
    };
  }

  // Off the chart the legend gives the latest bin, not the window the cards above give: it says
  // so in a badge ("latest bin"), which turns back into "UTC" when the pointer picks a bin.
  var LATEST_LABEL = "latest bin, UTC";
  function markLatest(u) {
    var latest = u.cursor.idx == null;
    u.root.classList.toggle("at-latest", latest);
    var label = u.root.querySelector(".u-legend .u-series:first-child .u-label");
    if (label) label.textContent = latest ? LATEST_LABEL : "UTC";
  }

  // The bin's request count, beside its time in the legend (`counts`: the series' `n`): a
  // legend's p50 = p90 = p95 = p99 then reads as one request's figure, not a tight spread.
  function countLegend(counts) {
    return function (u) {
      var first = u.root.querySelector(".u-legend tr.u-series");
      if (!first) return;
      var row = u.root.querySelector(".u-legend tr.u-count");
      if (!row) {
        row = document.createElement("tr");
        row.className = "u-count";
        row.title = "requests in this bin";
        row.appendChild(document.createElement("th")).textContent = "requests";
        row.appendChild(document.createElement("td")).className = "u-value";
        first.parentNode.insertBefore(row, first.nextSibling);
      }
      var idx = u.cursor.idx == null ? latestIndex(u) : u.cursor.idx;
      var n = idx == null ? null : counts[idx];
      row.lastChild.textContent = n == null ? "—" : n.toLocaleString("en-US");
    };
  }

  function plot(el, series, data, opts, binS, counts) {
    var width = Math.max(300, el.clientWidth || 460);
    var legendHooks = counts ? [markLatest, countLegend(counts)] : [markLatest];
    var o = Object.assign({ width: width, height: 200, tzDate: utc,
                            series: [{ label: "UTC", value: timeValue }].concat(series),
                            axes: [{ values: TIME_TICKS }, { size: axisSize }],
                            hooks: { ready: legendHooks, setLegend: legendHooks },
                            legend: { live: true } }, opts || {});
    o.scales = Object.assign({}, o.scales, { x: { time: true, range: timeRange(binS || 1) } });
    // one bin: ticks a slice apart (before, at and after it), not every 200 ms
    if (data[0].length === 1) o.axes = [Object.assign({}, o.axes[0], { incrs: [binS || 1] })].concat(o.axes.slice(1));
    return new uPlot(o, data, el);
  }

  var durationValue = legendValue(function (v) { return duration.text(v); });
  function durationTicks(u, splits, axisIdx, space, incr) { return duration.axis(splits, incr); }

  // A y range for rates and counts: from 0 to a rounded-up maximum (0 to 1 when all are 0).
  function fromZero(u, min, max) {
    return [0, max > 0 ? uPlot.rangeNum(0, max, 0.1, true)[1] : 1];
  }

  function overviewCharts() {
    var s = readJSON("series");
    if (!s || !s.t || !s.t.length || typeof uPlot === "undefined") return;
    // no two neighbouring bins with requests (one bin, or a few far apart): no line can be drawn,
    // so the rate and the shares are bars
    var sparse = !s.rps.some(function (r, i) { return i > 0 && r > 0 && s.rps[i - 1] > 0; });
    var bars = sparse ? uPlot.paths.bars({ size: [0.5, Infinity] }) : null;
    document.querySelectorAll("[data-chart]").forEach(function (el) {
      var kind = el.getAttribute("data-chart");
      if (kind === "latency") {
        var m = s[el.getAttribute("data-metric")];
        var ps = ["p50", "p90", "p95", "p99"];
        // no spanGaps: a bin without requests is a gap, not a line across it
        plot(el, ps.map(function (p) {
               return { label: p, stroke: COLORS[p], width: 1.5, value: durationValue,
                        points: { show: true, size: 6, fill: COLORS[p], filter: lonePoints } };
             }),
             [s.t].concat(ps.map(function (p) { return m[p]; })),
             { axes: [{ values: TIME_TICKS }, { size: axisSize, values: durationTicks }] }, s.bin_s, s.n);
      } else if (kind === "rps") {
        // a rate starts at 0: uPlot's own range starts near the smallest value, which makes
        // 2 vs 3 req/s look like a tenfold swing
        var rate = { label: "req/s", stroke: "#1d232a", fill: "rgba(29,35,42,.08)", width: 1.5, points: { show: false },
                     value: legendValue(function (v) { return String(Math.round(v * 100) / 100); }) };
        if (bars) Object.assign(rate, { paths: bars, fill: "rgba(29,35,42,.6)" });
        plot(el, [rate], [s.t, s.rps], { scales: { y: { range: fromZero } } }, s.bin_s);
      } else if (kind === "share") {
        // stacked, in the cards' order (network, queue, prefill, decode) from the top band down:
        // each line is its bucket's share plus those below it, so network's is the bin's whole
        // and is drawn first; each lower band paints over the one above it
        var names = ["network", "queue", "prefill", "decode"];
        // a bin without requests has no shares: null leaves a gap instead of a band at 0;
        // a bucket not measured in a bin (network without client spans) adds nothing to the stack
        var has = s.t.map(function (t, i) { return names.some(function (b) { return s.share[b][i] != null; }); });
        var acc = s.t.map(function () { return 0; });
        var stacked = [];
        for (var k = names.length - 1; k >= 0; k--) {
          acc = acc.map(function (v, i) { return has[i] ? v + (s.share[names[k]][i] || 0) * 100 : null; });
          stacked[k] = acc.slice();
        }
        plot(el, names.map(function (name) {
               // the legend gives the bucket's own share of the bin ("—" where not measured)
               var own = legendValue(function (v, si, idx) {
                 var share = s.share[name][idx];
                 return share == null ? "—" : (share * 100).toFixed(1) + " %";
               });
               // a lone bin between gaps has no band to fill: a dot at each band's top
               var band = { label: name, stroke: COLORS[name], fill: COLORS[name] + "cc", width: 1,
                            points: { show: true, size: 6, fill: COLORS[name], filter: lonePoints }, value: own };
               if (bars) band.paths = bars;
               return band;
             }),
             [s.t].concat(stacked),
             { scales: { y: { range: [0, 100] } } }, s.bin_s, s.n);
      }
    });
  }

  // The trace page's time axes (offsets within a request or the trace): ticks at round offsets,
  // as many as fit, labelled by duration.axis like the charts' duration axes.
  var STEP_FACTORS = [1, 2, 2.5, 5];
  function roundStep(total, most) {
    for (var mag = Math.pow(10, Math.floor(Math.log10(total / most))); ; mag *= 10) {
      for (var i = 0; i < STEP_FACTORS.length; i++) {
        if (STEP_FACTORS[i] * mag * most >= total) return STEP_FACTORS[i] * mag;
      }
    }
  }

  function offsetAxes() {
    document.querySelectorAll("[data-axis-ms]").forEach(function (el) {
      var total = parseFloat(el.getAttribute("data-axis-ms"));
      var ticks = [0], step = 1;
      if (total > 0) {
        step = roundStep(total, Math.max(2, Math.floor((el.clientWidth || 400) / 100)));
        for (var k = 1; k * step <= total * (1 + 1e-9); k++) ticks.push(k * step);
      }
      var labels = duration.axis(ticks, step);
      el.textContent = "";
      ticks.forEach(function (t, i) {
        var tick = document.createElement("span");
        tick.style.left = (total > 0 ? t / total * 100 : 0) + "%";
        tick.textContent = labels[i];
        el.appendChild(tick);
      });
      // a label centred on a tick near the right end would stick out of the axis: drop it,
      // or with only two ticks left end it at its tick
      var right = el.getBoundingClientRect().right + 0.5;
      while (el.lastChild.getBoundingClientRect().right > right) {
        if (el.children.length > 2) el.removeChild(el.lastChild);
        else { el.lastChild.classList.add("end"); break; }
      }
    });
  }

  // An element with a class and text (always text: span values never become markup).
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }

  // A span value as web/_span_details.py gives it: its text, or [its first characters, its
  // length], which is followed by the note saying how long it is and where the whole is.
  function putValue(parent, v, clipNote) {
    if (Array.isArray(v)) {
      parent.appendChild(document.createTextNode(v[0]));
      parent.appendChild(el("small", "clipped", clipNote.replace("{chars}", v[1].toLocaleString("en-US"))));
    } else {
      parent.appendChild(document.createTextNode(v));
    }
  }

  // Rows of a key/value table: [key, value] pairs, the values in <code> where `code`.
  function kvRows(table, pairs, clipNote, code) {
    pairs.forEach(function (pair) {
      var tr = table.appendChild(el("tr"));
      putValue(tr.appendChild(el("th")), pair[0], clipNote);
      var td = tr.appendChild(el("td"));
      putValue(code ? td.appendChild(el("code")) : td, pair[1], clipNote);
    });
  }

  // One span's detail panel (attributes, events, links, resource), built from the page's
  // span-details block when its row is first clicked.
  function spanDetail(block, i) {
    var sp = block.spans[i], note = block.clip_note;
    var box = el("div", "wf-detail");
    var table = box.appendChild(el("table", "kv"));
    var rows = sp.rows.map(function (v, k) { return [block.labels[k], v]; });
    kvRows(table, rows.slice(0, 1), note, true);  // the span id, in <code> as the attributes
    kvRows(table, rows.slice(1), note, false);
    kvRows(table, sp.attributes, note, true);
    if (sp.events.length) {
      box.appendChild(el("h4", null, "events"));
      var events = box.appendChild(el("table", "kv"));
      sp.events.forEach(function (ev) {
        var tr = events.appendChild(el("tr"));
        tr.appendChild(el("th", null, ev[0]));
        var td = tr.appendChild(el("td"));
        putValue(td, ev[1], note);
        ev[2].forEach(function (pair) {
          td.appendChild(document.createTextNode(" "));
          var c = td.appendChild(el("code"));
          putValue(c, pair[0], note);
          c.appendChild(document.createTextNode("="));
          putValue(c, pair[1], note);
        });
      });
    }
    if (sp.links.length) {
      box.appendChild(el("h4", null, "links"));
      var ul = box.appendChild(el("ul"));
      sp.links.forEach(function (lk) {
        var li = ul.appendChild(el("li"));
        var a = li.appendChild(el("a", null, lk[0]));
        a.href = "/trace/" + encodeURIComponent(lk[0]);
        li.appendChild(document.createTextNode(" / " + lk[1]));
      });
    }
    var res = box.appendChild(el("details"));
    res.appendChild(el("summary", null, "resource"));
    kvRows(res.appendChild(el("table", "kv")), block.resources[sp.resource] || [], note, false);
    return box;
  }

  // The waterfall: ▾ collapses a span's subtree, a click on a row shows its details. Rows are
  // found through maps built once (a trace may have 5,000 spans: a DOM query per descendant made
  // collapsing the root take seconds), and a detail panel is built on its row's first click.
  function waterfall() {
    var wf = document.getElementById("waterfall");
    if (!wf) return;
    var block = readJSON("span-details") || { spans: [], resources: [], clip_note: "" };
    var children = new Map(), toggles = new Map(), details = new Map();
    wf.querySelectorAll(".wf-row").forEach(function (r) {
      var p = r.getAttribute("data-parent");
      if (!children.has(p)) children.set(p, []);
      children.get(p).push(r);
      toggles.set(r, r.querySelector(".toggle"));
    });
    function setHidden(spanId, hidden) {
      var stack = [spanId];
      while (stack.length) {
        (children.get(stack.pop()) || []).forEach(function (child) {
          child.hidden = hidden;
          var detail = details.get(child);
          if (detail && hidden) {
            detail.hidden = true;
            child.classList.remove("selected");
          }
          var t = toggles.get(child);
          // a collapsed child keeps its own subtree collapsed when the parent reopens
          if (!hidden && t && t.getAttribute("aria-expanded") === "false") return;
          stack.push(child.getAttribute("data-span"));
        });
      }
    }
    wf.addEventListener("click", function (ev) {
      var row = ev.target.closest(".wf-row");
      if (!row) return;
      var t = ev.target.closest(".toggle");
      if (t) {
        var open = t.getAttribute("aria-expanded") === "true";
        t.setAttribute("aria-expanded", open ? "false" : "true");
        t.textContent = open ? "▸" : "▾";
        setHidden(row.getAttribute("data-span"), open);
        return;
      }
      var detail = details.get(row);
      if (!detail) {
        var i = Number(row.getAttribute("data-row"));
        if (!block.spans[i]) return;
        detail = spanDetail(block, i);
        detail.hidden = true;
        row.parentNode.insertBefore(detail, row.nextSibling);
        details.set(row, detail);
      }
      detail.hidden = !detail.hidden;
      row.classList.toggle("selected", !detail.hidden);
    });
  }

  overviewCharts();
  offsetAxes();
  window.addEventListener("resize", offsetAxes);
  waterfall();
})();
