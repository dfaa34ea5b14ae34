// Live telemetry in the browser: one WebSocket to /ws/live/ (the session cookie authenticates),
// subscriptions to groups ("gpu:<id>", "team:<id>", "reservation:<id>"), and per-group sequence
// numbers. A gap (the server may drop messages for a slow browser) or a reconnect re-fetches the
// group's current state from /telemetry/live/state/ and ignores anything older than it.
(function () {
  "use strict";

  function TesseraLive(groups, onUpdate) {
    this.groups = groups.slice();
    this.onUpdate = onUpdate;  // onUpdate(group, type, data)
    this.seq = {};             // group -> last sequence number applied
    this.refetching = {};
    this.backoff = 1000;
    this.connect();
  }

  TesseraLive.prototype.connect = function () {
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    var socket = new WebSocket(scheme + window.location.host + "/ws/live/");
    var self = this;
    socket.onopen = function () {
      self.backoff = 1000;
      socket.send(JSON.stringify({subscribe: self.groups}));
    };
    socket.onmessage = function (event) {
      var message;
      try { message = JSON.parse(event.data); } catch (e) { return; }
      if (message.type === "subscribed") {
        self.groups = message.groups;
        self.refetch(message.groups);  // whatever happened while we were away
      } else if (message.type === "revoked") {
        message.groups.forEach(function (g) { delete self.seq[g]; });
      } else if (message.group !== undefined) {
        self.apply(message);
      }
    };
    socket.onclose = function () {
      // Reconnect with backoff (portal restart, network); the state is re-fetched on subscribe.
      setTimeout(function () { self.connect(); }, self.backoff * (0.5 + Math.random() / 2));
      self.backoff = Math.min(self.backoff * 2, 30000);
    };
  };

  TesseraLive.prototype.apply = function (message) {
    var last = this.seq[message.group];
    if (last !== undefined && message.seq <= last) { return; }  // already in a fetched state
    if (last !== undefined && message.seq !== last + 1) {
      this.refetch([message.group]);
      return;
    }
    this.seq[message.group] = message.seq;
    this.onUpdate(message.group, message.type, message.data);
  };

  TesseraLive.prototype.refetch = function (groups) {
    var self = this;
    var wanted = groups.filter(function (g) { return !self.refetching[g]; });
    if (!wanted.length) { return; }
    wanted.forEach(function (g) { self.refetching[g] = true; });
    fetch("/telemetry/live/state/?groups=" + encodeURIComponent(wanted.join(",")), {credentials: "same-origin"})
      .then(function (response) { return response.ok ? response.json() : {groups: {}}; })
      .then(function (body) {
        Object.keys(body.groups).forEach(function (g) {
          var state = body.groups[g];
          self.seq[g] = state.seq;
          self.onUpdate(g, state.type, state.data);
        });
      })
      .finally(function () { wanted.forEach(function (g) { delete self.refetching[g]; }); });
  };

  window.TesseraLive = TesseraLive;

  // Reservation pages: rows marked data-live-reservation="<id>" get the share's measured use in
  // their [data-live-used] cell.
  document.addEventListener("DOMContentLoaded", function () {
    var cells = {};
    document.querySelectorAll("[data-live-reservation]").forEach(function (row) {
      var cell = row.querySelector("[data-live-used]");
      if (cell) { cells["reservation:" + row.getAttribute("data-live-reservation")] = cell; }
    });
    var groups = Object.keys(cells);
    if (!groups.length || !window.WebSocket) { return; }
    new TesseraLive(groups, function (group, type, data) {
      var cell = cells[group];
      if (!cell || type !== "shares" || !data) { return; }
      var used = 0;
      data.shares.forEach(function (s) { used += s.used_frac; });
      cell.textContent = data.shares.length ? Math.round(used * 100) + " % of a GPU" : "";
    });
  });
})();
