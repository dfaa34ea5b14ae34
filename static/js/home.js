// Home: rows marked data-live-reservation="<id>" get the share's measured use in their
// [data-live-used] cell, live over ws/live/.
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", function () {
    var cells = {};
    document.querySelectorAll("[data-live-reservation]").forEach(function (row) {
      var cell = row.querySelector("[data-live-used]");
      if (cell) { cells["reservation:" + row.getAttribute("data-live-reservation")] = cell; }
    });
    var groups = Object.keys(cells);
    if (!groups.length || !window.WebSocket) { return; }
    new window.Tessera.Live(groups, function (group, type, data) {
      var cell = cells[group];
      if (!cell || type !== "shares" || !data) { return; }
      var used = 0;
      data.shares.forEach(function (s) { used += s.used_frac; });
      cell.textContent = data.shares.length ? Math.round(used * 100) + " % of a GPU" : "";
    });
  });
})();
