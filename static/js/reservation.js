// Reservation page: the usage charts get live points at their right edge, and the summary
// (state, facts, timeline, actions) is fetched again from the server when the reservation
// changes. One group on ws/live/: reservation:<id> (the server refuses it to other teams).
(function () {
  "use strict";

  function gib(mib) { return (mib / 1024).toFixed(1) + " GiB"; }

  document.addEventListener("DOMContentLoaded", function () {
    var root = document.getElementById("reservation");
    if (!root) { return; }
    var id = root.getAttribute("data-reservation");
    var request = parseFloat(root.getAttribute("data-request"));
    var limit = parseFloat(root.getAttribute("data-limit"));
    var cap = parseFloat(root.getAttribute("data-memory-cap"));
    var charts = {};
    root.querySelectorAll("figure[data-chart]").forEach(function (figure) {
      charts[figure.getAttribute("data-chart")] = window.Tessera.chart(figure);
    });
    var now = root.querySelector("[data-live-now]");
    var lastState = document.getElementById("summary").getAttribute("data-state");
    // Only a reservation that holds its GPUs has a "now": once it ended, a late reading is history.
    function holds(state) { return state === "placed" || state === "running"; }

    function refreshSummary() {
      window.htmx.ajax("GET", "/reservations/" + id + "/?part=summary", {target: "#summary", swap: "outerHTML"})
        .then(function () {
          var summary = document.getElementById("summary");
          var state = summary ? summary.getAttribute("data-state") : lastState;
          if (state !== lastState) {
            window.Tessera.toast("Reservation " + id + " is " + state + ".", "info");
            window.htmx.ajax("GET", "/reservations/" + id + "/log/", {target: "#pod-log", swap: "outerHTML"});
            lastState = state;
            if (!holds(state) && now) { now.textContent = ""; }
          }
        });
    }

    function onShares(shares) {
      if (!shares.length || !holds(lastState)) { return; }
      var used = 0, mem = null, ts = 0;
      shares.forEach(function (s) {
        used += s.used_frac;
        if (s.mem_used_mib !== null && s.mem_used_mib !== undefined) { mem = Math.max(mem || 0, s.mem_used_mib); }
        ts = Math.max(ts, s.ts_ms || 0);
      });
      used = used / shares.length;
      var x = (ts || Date.now()) / 1000;
      if (charts["chart-compute"]) {
        charts["chart-compute"].push(x, [Math.round(used * 1000) / 10, request * 100, limit * 100], 600);
      }
      if (charts["chart-memory"] && mem !== null) {
        charts["chart-memory"].push(x, [Math.round(mem / 10.24) / 100, Math.round(cap / 10.24) / 100], 600);
      }
      // The sentence is aria-live: say it at most every 5 s, not at every reading.
      if (now && (!now.dataset.saidAt || Date.now() - Number(now.dataset.saidAt) > 5000)) {
        now.dataset.saidAt = String(Date.now());
        now.textContent = "Now: " + Math.round(used * 100) + " % of a GPU" + (mem === null ? "" : ", " + gib(mem) +
          " of " + gib(cap)) + ".";
      }
    }

    // A borrowed reservation being reclaimed: the time left, each second (the notice's sentence,
    // which screen readers hear, says the time once; this figure is for the eye only).
    function tick() {
      document.querySelectorAll("[data-countdown]").forEach(function (el) {
        var left = Math.floor((Date.parse(el.getAttribute("data-countdown")) - Date.now()) / 1000);
        if (isNaN(left)) { return; }
        if (left <= 0) { el.textContent = "Due now"; return; }
        var h = Math.floor(left / 3600), m = Math.floor(left % 3600 / 60), sec = left % 60;
        el.textContent = (h ? h + ":" + String(m).padStart(2, "0") : m) + ":" + String(sec).padStart(2, "0") + " left";
      });
    }
    tick();
    setInterval(tick, 1000);
    document.body.addEventListener("htmx:afterSwap", tick);  // a fresh summary shows the time left at once

    if (!window.WebSocket) { return; }
    new window.Tessera.Live(["reservation:" + id], function (group, type, data, fromState) {
      if (type === "reservations") {
        refreshSummary();
      } else if (type === "shares" && data) {
        onShares(data.shares || []);
        if (fromState) { refreshSummary(); }  // (re)subscribed or a gap: catch up on the state too
      }
    });
  });
})();
