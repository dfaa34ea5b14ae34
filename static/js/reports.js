// Reports pages (overview and usage report): draw the charts with uPlot from the JSON the server
// put beside each figure; the table beside every chart holds the same numbers.
// - over time: allocated GPU-hours per bucket stacked by team (bars), used GPU-hours as a line;
// - breakdown: allocated and used GPU-hours side by side per row.
// Also gives the time-zone field the browser's zone when the URL named none, so dates typed in
// the date pickers mean the person's own days.
(function () {
  "use strict";

  function cssVar(name, fallback) {
    var v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    return v || fallback;
  }

  function alpha(hex, a) {
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16 & 255) + "," + (n >> 8 & 255) + "," + (n & 255) + "," + a + ")";
  }

  function axes(xValues) {
    var grid = {stroke: cssVar("--line", "#ddd"), width: 1};
    var x = {stroke: cssVar("--muted", "#666"), grid: {show: false}, ticks: grid};
    if (xValues) { Object.assign(x, xValues); }
    return [x, {stroke: cssVar("--muted", "#666"), grid: grid, ticks: grid, size: window.Tessera.fitAxis,
      values: function (u, vals) { return vals.map(function (v) { return v + " h"; }); }}];
  }

  function draw(figure, options, data) {
    var holder = figure.querySelector(".chart-plot");
    var width = function () { return Math.max(260, holder.clientWidth || 600); };
    options.width = width();
    options.height = 240;
    options.legend = {show: false};
    options.cursor = {drag: {x: false, y: false}};
    var plot = new window.uPlot(options, data, holder);
    var timer = null;
    window.addEventListener("resize", function () {
      clearTimeout(timer);
      timer = setTimeout(function () { plot.setSize({width: width(), height: 240}); }, 150);
    });
    figure.setAttribute("data-points", String(data[0].length));
    figure.setAttribute("data-drawn", "true");
  }

  function overTime(figure, spec) {
    var n = spec.x.length;
    if (!n) { return; }
    var bucket = spec.bucket_hours * 3600;
    var bars = window.uPlot.paths.bars({size: [0.92, Infinity], align: 1});
    var totals = new Array(n).fill(0);
    var stacks = spec.teams.map(function (team) {
      totals = totals.map(function (v, i) { return v + team.allocated[i]; });
      return totals.slice();
    });
    // One more x (the last bucket's end) so the last bar and the used line's last step have a width.
    var series = [{}];
    var data = [spec.x.concat([spec.x[n - 1] + bucket])];
    // The tallest stack first: each smaller one is painted over it, so the bands read as a stack.
    for (var k = stacks.length - 1; k >= 0; k--) {
      var colour = spec.teams[k].colour;
      series.push({label: spec.teams[k].label + " allocated", stroke: colour, fill: alpha(colour, 0.55),
                   width: 1, paths: bars, points: {show: false}});
      data.push(stacks[k].concat([null]));
    }
    series.push({label: "used", stroke: cssVar("--series-used", "#0072B2"), width: 2.5,
                 paths: window.uPlot.paths.stepped({align: 1}), points: {show: false}});
    data.push(spec.used.concat([spec.used[n - 1]]));
    var ymax = Math.max.apply(null, totals.concat(spec.used)) || 1;
    draw(figure, {series: series, axes: axes(),
                  scales: {x: {time: true}, y: {range: function () { return [0, ymax * 1.08]; }}}}, data);
  }

  function breakdown(figure, spec) {
    var n = spec.labels.length;
    if (!n) { return; }
    var x = spec.labels.map(function (_, i) { return i; });
    var allocated = cssVar("--series-allocated", "#9bb3de");
    var used = cssVar("--series-used", "#0072B2");
    var short = function (s) { return s.length > 14 ? s.slice(0, 13) + "…" : s; };
    var ymax = Math.max.apply(null, spec.allocated.concat(spec.used)) || 1;
    draw(figure, {
      series: [{}, {label: "allocated", stroke: allocated, fill: allocated, paths: window.uPlot.paths.bars({size: [0.4, 60], align: -1}), points: {show: false}},
               {label: "used", stroke: used, fill: used, paths: window.uPlot.paths.bars({size: [0.4, 60], align: 1}), points: {show: false}}],
      axes: axes({space: 70, incrs: [1, 2, 5, 10, 20],
                  values: function (u, vals) { return vals.map(function (v) { return spec.labels[v] !== undefined && v % 1 === 0 ? short(spec.labels[v]) : ""; }); }}),
      scales: {x: {time: false, range: function () { return [-0.6, n - 0.4]; }},
               y: {range: function () { return [0, ymax * 1.08]; }}}
    }, [x, spec.allocated, spec.used]);
  }

  function timeZone() {
    var field = document.getElementById("f-tz");
    if (!field || new URLSearchParams(window.location.search).get("tz")) { return; }
    var zone = "";
    try { zone = Intl.DateTimeFormat().resolvedOptions().timeZone || ""; } catch (e) { return; }
    if (!zone) { return; }
    field.value = zone;
    document.querySelectorAll("[data-tz-label]").forEach(function (el) { el.textContent = zone; });
  }

  document.addEventListener("DOMContentLoaded", function () {
    timeZone();
    if (!window.uPlot) { return; }  // the tables still carry every number
    document.querySelectorAll("[data-report-chart]").forEach(function (figure) {
      var source = document.getElementById(figure.getAttribute("data-series-id"));
      if (!source) { return; }
      var spec = JSON.parse(source.textContent);
      if (figure.getAttribute("data-report-chart") === "series") { overTime(figure, spec); } else { breakdown(figure, spec); }
    });
  });
})();
