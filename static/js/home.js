// Home: my reservations stay current without a reload. The page listens to its teams' groups on
// ws/live/: a "reservations" message names reservations that changed and the page fetches each
// one's server-rendered card (404: gone from view; 204: a teammate's); "shares" messages feed the
// cards' sparklines and live numbers. After every (re)subscription the cards are fetched again,
// so nothing that happened while the socket was away is missed.
(function () {
  "use strict";
  var ACTIVE = {pending: true, placed: true, running: true};
  var COMPUTE = [{key: "used", label: "used"}, {key: "request", label: "request", dash: true},
                 {key: "limit", label: "limit", dash: true}];
  var MEMORY = [{key: "memory", label: "used"}, {key: "limit", label: "cap", dash: true}];
  var history = {};  // reservation id -> [[x, used, memFrac], ...] (kept across card swaps)
  var sparks = {};   // reservation id -> {compute, memory}
  var said = {};     // reservation id -> the last live sentence (a swapped-in card starts with it)
  var list;

  function cardOf(id) { return document.getElementById("reservation-" + id); }

  function attachSparks(card) {
    var id = card.getAttribute("data-reservation");
    var compute = card.querySelector("[data-spark=compute]");
    var memory = card.querySelector("[data-spark=memory]");
    if (!compute || !memory) { delete sparks[id]; return; }
    sparks[id] = {compute: window.Tessera.sparkline(compute, COMPUTE, 90),
                  memory: window.Tessera.sparkline(memory, MEMORY, 90)};
    (history[id] || []).forEach(function (p) { draw(card, id, p); });
    var now = card.querySelector("[data-live-now]");
    if (now && said[id]) { now.textContent = said[id]; }
  }

  function draw(card, id, p) {
    var s = sparks[id];
    if (!s) { return; }
    var request = parseFloat(card.getAttribute("data-request"));
    var limit = parseFloat(card.getAttribute("data-limit"));
    s.compute.push(p[0], [p[1], request, limit]);
    s.memory.push(p[0], [p[2], 1]);
  }

  function gib(mib) { return (mib / 1024).toFixed(mib >= 10240 ? 0 : 1) + " GiB"; }

  function onShares(shares) {
    var byId = {};
    shares.forEach(function (s) {
      var e = byId[s.reservation] || (byId[s.reservation] = {used: 0, n: 0, mem: null, ts: 0});
      e.used += s.used_frac;
      e.n += 1;
      if (s.mem_used_mib !== null && s.mem_used_mib !== undefined) { e.mem = Math.max(e.mem || 0, s.mem_used_mib); }
      e.ts = Math.max(e.ts, s.ts_ms || Date.now());
    });
    Object.keys(byId).forEach(function (id) {
      var card = cardOf(id);
      if (!card) { return; }
      var e = byId[id];
      var used = e.used / e.n;
      var cap = parseFloat(card.getAttribute("data-memory-cap"));
      var point = [e.ts / 1000, used, e.mem === null ? null : e.mem / cap];
      var h = history[id] || (history[id] = []);
      if (h.length && point[0] <= h[h.length - 1][0]) { return; }
      h.push(point);
      if (h.length > 90) { h.shift(); }
      draw(card, id, point);
      var now = card.querySelector("[data-live-now]");
      // The sentence is aria-live: say it at most every 5 s, not at every reading.
      if (now && (!now.dataset.saidAt || Date.now() - Number(now.dataset.saidAt) > 5000)) {
        now.dataset.saidAt = String(Date.now());
        now.textContent = said[id] = "Using " + Math.round(used * 100) + " % of a GPU (request " +
          Math.round(parseFloat(card.getAttribute("data-request")) * 100) + " %, limit " +
          Math.round(parseFloat(card.getAttribute("data-limit")) * 100) + " %)" +
          (e.mem === null ? "" : " · " + gib(e.mem) + " of " + gib(cap) + " memory");
      }
    });
  }

  function refreshCard(id) {
    return fetch("/reservations/" + id + "/card/?mine=1", {credentials: "same-origin",
                                                            headers: {"HX-Request": "true"}})
      .then(function (response) {
        var card = cardOf(id);
        if (response.status === 404) { if (card) { card.remove(); } return; }
        if (response.status !== 200) { return; }
        return response.text().then(function (html) {
          var holder = document.createElement("div");
          holder.innerHTML = html.trim();
          var fresh = holder.firstElementChild;
          if (!fresh) { return; }
          var before = card ? card.getAttribute("data-state") : null;
          if (card) { card.replaceWith(fresh); } else { list.insertBefore(fresh, list.firstChild); }
          var empty = document.getElementById("no-active");
          if (empty) { empty.remove(); }
          attachSparks(fresh);
          var after = fresh.getAttribute("data-state");
          if (before && before !== after) {
            window.Tessera.toast("Reservation " + id + " is " + after + ".", ACTIVE[after] ? "ok" : "info");
          }
        });
      })
      .catch(function () { /* the next message or reconnect asks again */ });
  }

  function refreshAll() {
    document.querySelectorAll("#my-reservations [data-reservation]").forEach(function (card) {
      refreshCard(card.getAttribute("data-reservation"));
    });
    document.body.dispatchEvent(new CustomEvent("tessera:changed"));
  }

  document.addEventListener("DOMContentLoaded", function () {
    list = document.getElementById("my-reservations");
    if (!list) { return; }
    list.querySelectorAll("[data-reservation]").forEach(attachSparks);
    var groups = (list.getAttribute("data-live-groups") || "").split(",").filter(Boolean);
    if (!groups.length || !window.WebSocket) { return; }
    new window.Tessera.Live(groups, function (group, type, data, fromState) {
      if (type === "reservations" && data) {
        data.changed.forEach(refreshCard);
        document.body.dispatchEvent(new CustomEvent("tessera:changed"));
      } else if (type === "shares" && data) {
        onShares(data.shares || []);
        if (fromState) { refreshAll(); }  // (re)subscribed or a gap: catch up on states too
      }
    });
  });
})();
