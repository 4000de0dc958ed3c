// tokentrace explorer behaviour: overview charts (uPlot) and the waterfall (collapse, details).
// No inline scripts anywhere (the CSP forbids them); data arrives as JSON blocks.
(function () {
  "use strict";
  var COLORS = { p50: "#3d85c6", p90: "#6aa84f", p95: "#e69138", p99: "#cc0000",
                 network: "#8e7cc3", queue: "#e69138", prefill: "#3d85c6", decode: "#6aa84f" };

  function readJSON(id) {
    var el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }

  function plot(el, series, data, opts) {
    var width = Math.max(300, el.clientWidth || 460);
    var o = Object.assign({ width: width, height: 200, series: [{}].concat(series),
                            scales: { x: { time: true } }, legend: { live: true } }, opts || {});
    return new uPlot(o, data, el);
  }

  function overviewCharts() {
    var s = readJSON("series");
    if (!s || !s.t || !s.t.length || typeof uPlot === "undefined") return;
    document.querySelectorAll("[data-chart]").forEach(function (el) {
      var kind = el.getAttribute("data-chart");
      if (kind === "latency") {
        var m = s[el.getAttribute("data-metric")];
        var ps = ["p50", "p90", "p95", "p99"];
        plot(el, ps.map(function (p) { return { label: p, stroke: COLORS[p], width: 1.5, spanGaps: true, points: { show: false } }; }),
             [s.t].concat(ps.map(function (p) { return m[p]; })));
      } else if (kind === "rps") {
        plot(el, [{ label: "req/s", stroke: "#1d232a", fill: "rgba(29,35,42,.08)", width: 1.5, points: { show: false } }], [s.t, s.rps]);
      } else if (kind === "share") {
        // stacked: each line is the running sum so the bands read as shares of 100 %
        // drawn top band first, so each lower band paints over the one above it
        var names = ["network", "queue", "prefill", "decode"];
        var acc = s.t.map(function () { return 0; });
        var stacked = names.map(function (b) {
          acc = acc.map(function (v, i) { return v + (s.share[b][i] || 0) * 100; });
          return acc.slice();
        });
        var order = [3, 2, 1, 0];
        plot(el, order.map(function (i) {
               return { label: names[i] + " (stacked %)", stroke: COLORS[names[i]], fill: COLORS[names[i]] + "cc",
                        width: 1, points: { show: false } };
             }),
             [s.t].concat(order.map(function (i) { return stacked[i]; })),
             { scales: { x: { time: true }, y: { range: [0, 100] } } });
      }
    });
  }

  function waterfall() {
    var wf = document.getElementById("waterfall");
    if (!wf) return;
    var rows = Array.prototype.slice.call(wf.querySelectorAll(".wf-row"));
    var byParent = {};
    rows.forEach(function (r) {
      var p = r.getAttribute("data-parent");
      (byParent[p] = byParent[p] || []).push(r);
    });
    function setHidden(spanId, hidden) {
      (byParent[spanId] || []).forEach(function (child) {
        child.hidden = hidden;
        var detail = wf.querySelector('[data-detail="' + CSS.escape(child.getAttribute("data-span")) + '"]');
        if (detail && hidden) detail.hidden = true;
        var t = child.querySelector(".toggle");
        // a collapsed child keeps its own subtree collapsed when the parent reopens
        if (!hidden && t && t.getAttribute("aria-expanded") === "false") return;
        setHidden(child.getAttribute("data-span"), hidden);
      });
    }
    wf.addEventListener("click", function (ev) {
      var row = ev.target.closest(".wf-row");
      if (!row) return;
      var id = row.getAttribute("data-span");
      if (ev.target.closest(".toggle")) {
        var t = ev.target.closest(".toggle");
        var open = t.getAttribute("aria-expanded") === "true";
        t.setAttribute("aria-expanded", open ? "false" : "true");
        t.textContent = open ? "▸" : "▾";
        setHidden(id, open);
        return;
      }
      var detail = wf.querySelector('[data-detail="' + CSS.escape(id) + '"]');
      if (detail) {
        detail.hidden = !detail.hidden;
        row.classList.toggle("selected", !detail.hidden);
      }
    });
  }

  overviewCharts();
  waterfall();
})();
