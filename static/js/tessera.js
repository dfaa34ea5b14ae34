// Tessera's shared browser code, loaded by every page (base.html): toasts, confirmations, and
// uPlot charts (the live socket and its connection banner: live.js, loaded right after this). Pages add one small file each
// (static/js/<page>.js). No inline scripts or handlers anywhere: the strict CSP to come forbids them.
(function () {
  "use strict";
  var Tessera = window.Tessera = window.Tessera || {};

  // ---- Toasts --------------------------------------------------------------------------------
  Tessera.toast = function (text, tone) {
    var box = document.getElementById("toasts");
    if (!box) { return; }
    var toast = document.createElement("div");
    toast.className = "toast tone-" + (tone || "info");
    var span = document.createElement("span");
    span.textContent = text;
    var close = document.createElement("button");
    close.type = "button";
    close.setAttribute("data-dismiss", "");
    close.setAttribute("aria-label", "Dismiss");
    close.textContent = "×";
    toast.appendChild(span);
    toast.appendChild(close);
    box.appendChild(toast);
    setTimeout(function () { toast.remove(); }, 8000);
  };

  document.addEventListener("click", function (event) {
    var dismiss = event.target.closest("[data-dismiss]");
    if (dismiss) { dismiss.closest(".toast").remove(); }
  });

  // A form with data-confirm="question" is sent only after the person says yes.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
      event.stopImmediatePropagation();
    }
  }, true);

  // htmx: a failed request says so instead of failing silently.
  document.addEventListener("htmx:responseError", function (event) {
    var status = event.detail.xhr ? event.detail.xhr.status : 0;
    Tessera.toast(status === 404 ? "That is gone or not yours to see." :
      "The server could not answer (" + status + "). Try again in a moment.", "bad");
  });
  document.addEventListener("htmx:sendError", function () {
    Tessera.toast("The portal cannot be reached. Check your connection.", "bad");
  });

  // ---- Live socket: static/js/live.js (one WebSocket per tab, shared by the bell and the page) --

  // ---- Charts (uPlot) ----------------------------------------------------------------------
  function cssVar(name, fallback) {
    var v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    return v || fallback;
  }

  function seriesOptions(s) {
    return {label: s.label, stroke: cssVar("--series-" + s.key, "#0072B2"), width: s.key === "used" ? 2 : 1.5,
            dash: s.dash ? [6, 4] : undefined, points: {show: false}};
  }

  // Time ticks at whole seconds at least (uPlot's own steps go down to milliseconds, which read
  // ":01.500" on a chart whose points arrive a second apart), labelled to the step's precision.
  var TIME_INCRS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200,
                    86400, 172800, 604800, 2592000];
  function two(n) { return String(n).padStart(2, "0"); }
  function timeTicks(u, splits, axisIdx, space, incr) {
    return splits.map(function (s) {
      var d = new Date(s * 1000);
      if (incr >= 86400) { return d.getFullYear() + "-" + two(d.getMonth() + 1) + "-" + two(d.getDate()); }
      var hm = two(d.getHours()) + ":" + two(d.getMinutes());
      return incr >= 60 ? hm : hm + ":" + two(d.getSeconds());
    });
  }

  // A value axis as wide as its longest label ("12.5 GiB"), not a fixed width that clips it.
  function fitLabels(u, values, axisIdx, cycleNum) {
    var axis = u.axes[axisIdx];
    if (!values) { return axis._size || 50; }  // not laid out yet: measured on the next cycle
    var longest = (values || []).reduce(function (a, v) { return String(v).length > a.length ? String(v) : a; }, "");
    var size = (axis.ticks && axis.ticks.show !== false ? axis.ticks.size || 10 : 0) + (axis.gap || 5) + 8;
    if (longest) {
      u.ctx.font = axis.font[0];
      size += u.ctx.measureText(longest).width / (window.devicePixelRatio || 1);
    }
    return Math.ceil(size);
  }

  Tessera.fitAxis = fitLabels;
  Tessera.timeTicks = {incrs: TIME_INCRS, values: timeTicks};

  // Draw the chart of a components/chart.html figure; returns {spec, push(x, values, keep)}.
  Tessera.chart = function (figure, opts) {
    opts = opts || {};
    var id = figure.getAttribute("data-chart");
    var spec = JSON.parse(document.getElementById(id).textContent);
    var holder = figure.querySelector(".chart-plot");
    var data = [spec.x.slice()].concat(spec.series.map(function (s) { return s.values.slice(); }));
    var height = opts.height || 200;
    var plot = null;
    function build() {
      if (!window.uPlot) { return; }
      if (plot) { plot.destroy(); }
      // Colours come from the CSS variables of the scheme in use: rebuilt when it changes.
      var grid = {stroke: cssVar("--line", "#ddd"), width: 1};
      var axis = {stroke: cssVar("--muted", "#666"), grid: grid, ticks: grid};
      plot = new window.uPlot({
        width: Math.max(240, holder.clientWidth || 600), height: height, legend: {show: false},
        cursor: {drag: {x: false, y: false}},
        scales: {y: {range: function (u, min, max) { return [0, Math.max(spec.ymax || 0, max || 0) * 1.05 || 1]; }}},
        axes: [Object.assign({}, axis, {incrs: TIME_INCRS, values: timeTicks}),
               Object.assign({}, axis, {size: fitLabels, values: function (u, vals) {
                 return vals.map(function (v) { return v + (spec.unit ? " " + spec.unit : ""); });
               }})],
        series: [{}].concat(spec.series.map(seriesOptions))
      }, data, holder);
      figure.uplot = plot;  // the drawn chart, for the page's scripts (and checks of its axes)
    }
    build();
    if (window.matchMedia) {
      window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", build);
    }
    figure.setAttribute("data-points", String(data[0].length));
    var resizeTimer = null;
    window.addEventListener("resize", function () {
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(function () {
        if (plot) { plot.setSize({width: Math.max(240, holder.clientWidth), height: height}); }
      }, 150);
    });
    return {
      spec: spec,
      // Add a point at the right edge (x in unix seconds), keeping at most `keep` points.
      push: function (x, values, keep) {
        var n = data[0].length;
        if (n && x <= data[0][n - 1]) { return false; }
        data[0].push(x);
        values.forEach(function (v, i) { data[i + 1].push(v); });
        if (keep && data[0].length > keep) { data.forEach(function (col) { col.splice(0, col.length - keep); }); }
        if (plot) { plot.setData(data); }
        figure.setAttribute("data-points", String(data[0].length));
        return true;
      }
    };
  };

  // A sparkline: a tiny uPlot without axes in `el`; returns {push(x, values)}.
  Tessera.sparkline = function (el, series, keep) {
    var data = [[]].concat(series.map(function () { return []; }));
    var plot = null;
    var resizeTimer = null;
    window.addEventListener("resize", function () {
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(function () {
        if (plot && el.isConnected) { plot.setSize({width: Math.max(120, el.clientWidth), height: 40}); }
      }, 150);
    });
    return {
      push: function (x, values) {
        var n = data[0].length;
        if (n && x <= data[0][n - 1]) { return; }
        data[0].push(x);
        values.forEach(function (v, i) { data[i + 1].push(v); });
        if (data[0].length > (keep || 60)) { data.forEach(function (col) { col.shift(); }); }
        if (!plot && window.uPlot) {
          plot = new window.uPlot({
            width: Math.max(120, el.clientWidth || 200), height: 40, legend: {show: false}, cursor: {show: false},
            axes: [{show: false}, {show: false}], scales: {x: {time: false}, y: {range: [0, 1.05]}},
            series: [{}].concat(series.map(seriesOptions))
          }, data, el);
        } else if (plot) {
          plot.setData(data);
        }
        el.setAttribute("data-points", String(data[0].length));
      }
    };
  };
})();
