// The fleet page: live utilization of the GPUs on screen over /ws/live/ (gpu:<id> groups, site
// admins only), and the nodes' state, last report and shares fetched again every 30 s while the
// page is visible. The server draws shares and memory; this file only moves the utilization bar
// and its text, and follows the list when htmx replaces it (filters, pages, the refresh).
(function () {
  "use strict";
  var live = null;
  var REFRESH_MS = 30000;

  function gpuIds() {
    var list = document.querySelector("ol.fleet[data-gpus]");
    if (!list || !list.getAttribute("data-gpus")) { return []; }
    return list.getAttribute("data-gpus").split(",").map(function (id) { return "gpu:" + id; });
  }

  function show(group, type, data) {
    if (type !== "gpu" || !data) { return; }
    var cell = document.querySelector('[data-gpu="' + group.slice(4) + '"]');
    if (!cell) { return; }
    var pct = Math.max(0, Math.min(100, Number(data.sm_util_pct) || 0));
    var bar = cell.querySelector("[data-util]");
    if (bar) { bar.setAttribute("width", String(pct)); }  // an attribute, not a style: CSP-safe
    var text = cell.querySelector("[data-util-text]");
    if (text) { text.textContent = Math.round(pct) + " %"; }
    cell.setAttribute("data-util-pct", String(Math.round(pct)));
  }

  function start() {
    var groups = gpuIds();
    if (!groups.length || !window.Tessera || !window.Tessera.Live) { return; }
    if (live) {
      live.subscribe(groups);
      live.refetch(groups);  // redrawn cells start empty: fill them from the current state
      return;
    }
    live = new window.Tessera.Live(groups, show);
  }

  function refresh() {
    var nodes = document.getElementById("nodes");
    if (!nodes || document.hidden || !window.htmx || nodes.querySelector("form:focus-within")) { return; }
    window.htmx.ajax("GET", window.location.pathname + window.location.search, {target: "#nodes", swap: "innerHTML"});
  }

  document.addEventListener("DOMContentLoaded", function () {
    start();
    setInterval(refresh, REFRESH_MS);
  });
  document.addEventListener("htmx:afterSwap", function (event) {
    if (event.detail.target && event.detail.target.id === "nodes") { start(); }
  });
})();
