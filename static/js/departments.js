// Departments page: per bucket (GPU model or *), a grouped bar chart of each unit's quota, in use,
// borrowed and lent GPU share, drawn with uPlot from the JSON beside the figure. The table beside
// each chart holds the same numbers (and memory and GPUs), so the page reads without this script.
(function () {
  "use strict";

  var SLOT = 5;  // four bars per unit and a gap

  function cssVar(name, fallback) {
    var v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    return v || fallback;
  }

  function draw(figure) {
    var source = document.getElementById(figure.getAttribute("data-bucket-chart"));
    if (!source) { return; }
    var spec = JSON.parse(source.textContent);
    var n = spec.units.length;
    if (!n) { return; }
    var k = spec.series.length;
    // One x per bar: unit i's series j at i * SLOT + j; every series is null where the others are.
    var xs = [];
    var columns = spec.series.map(function () { return []; });
    var ymax = 0;
    for (var i = 0; i < n; i++) {
      for (var j = 0; j < k; j++) {
        xs.push(i * SLOT + j);
        for (var s = 0; s < k; s++) {
          var v = s === j ? spec.series[s].values[i] : null;
          columns[s].push(v);
          if (v !== null && v > ymax) { ymax = v; }
        }
      }
    }
    var holder = figure.querySelector(".chart-plot");
    var box = holder.parentNode;
    // At least 84 px per unit: a narrow screen scrolls the chart sideways rather than squeeze it.
    var width = function () { return Math.max(box.clientWidth || 600, n * 84 + 60, 240); };
    var bars = window.uPlot.paths.bars({size: [0.9, 36], align: 0});
    var muted = cssVar("--muted", "#666");
    var grid = {stroke: cssVar("--line", "#ddd"), width: 1};
    var centre = (k - 1) / 2;
    // A label fits its unit's width (about 7 px a character).
    var short = function (t) {
      var room = Math.max(5, Math.floor((width() - 60) / n / 8.5));
      return t.length > room ? t.slice(0, room - 1) + "…" : t;
    };
    var plot = new window.uPlot({
      width: width(), height: 220, legend: {show: false}, cursor: {drag: {x: false, y: false}, points: {show: false}},
      scales: {x: {time: false, range: function () { return [-0.8, (n - 1) * SLOT + k - 0.2]; }},
               y: {range: function () { return [0, (ymax || 1) * 1.1]; }}},
      axes: [
        {stroke: muted, grid: {show: false}, ticks: {show: false}, gap: 4,
         splits: function () { return spec.units.map(function (_, u) { return u * SLOT + centre; }); },
         values: function (u, splits) {
           return splits.map(function (x) { return short(spec.units[Math.round((x - centre) / SLOT)] || ""); });
         }},
        {stroke: muted, grid: grid, ticks: grid, size: window.Tessera.fitAxis}
      ],
      series: [{}].concat(spec.series.map(function (s) {
        var colour = cssVar("--series-" + s.key, "#0072B2");
        return {label: s.label, stroke: colour, fill: colour, width: 1, paths: bars, points: {show: false}};
      }))
    }, [xs].concat(columns), holder);
    var timer = null;
    window.addEventListener("resize", function () {
      clearTimeout(timer);
      timer = setTimeout(function () { plot.setSize({width: width(), height: 220}); }, 150);
    });
    figure.setAttribute("data-drawn", "true");
  }

  document.addEventListener("DOMContentLoaded", function () {
    if (!window.uPlot) { return; }  // the tables carry every number
    document.querySelectorAll("[data-bucket-chart]").forEach(draw);
  });
})();
