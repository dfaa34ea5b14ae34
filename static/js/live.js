// The tab's live socket: ONE WebSocket to /ws/live/ per tab (the session cookie authenticates),
// shared by everything on the page that follows live groups: the header's bell ("user:<id>") and
// the page's own updates ("gpu:<id>", "team:<id>", "reservation:<id>", "fleet").
//
// Each of them subscribes with `new Tessera.Live(groups, onUpdate)`: a subscription on the shared
// connection, opened at the first one. The connection holds the union of their groups and one
// sequence number per group; a message goes to the subscriptions that hold its group. A gap (the
// server may drop messages for a slow browser) or a (re)subscription re-fetches the group's current
// state from /telemetry/live/state/ and ignores anything older than it.
(function () {
  "use strict";
  var Tessera = window.Tessera = window.Tessera || {};

  // ---- Connection banner -------------------------------------------------------------------
  var bannerTimer = null;
  function banner(text, ok) {
    var el = document.getElementById("connection");
    if (!el) { return; }
    clearTimeout(bannerTimer);
    el.textContent = text;
    el.classList.toggle("is-ok", !!ok);
    el.hidden = false;
    if (ok) { bannerTimer = setTimeout(function () { el.hidden = true; }, 3000); }
  }

  // ---- The shared connection -----------------------------------------------------------------
  function Connection() {
    this.subscriptions = [];
    this.seq = {};
    this.refetching = {};
    this.backoff = 1000;
    this.lost = false;
    this.socket = null;
  }

  Connection.prototype.holds = function (group) {
    return this.subscriptions.some(function (s) { return s.groups.indexOf(group) >= 0; });
  };

  Connection.prototype.groups = function () {
    var all = [];
    this.subscriptions.forEach(function (s) {
      s.groups.forEach(function (g) { if (all.indexOf(g) < 0) { all.push(g); } });
    });
    return all;
  };

  Connection.prototype.send = function (body) {
    if (this.socket && this.socket.readyState === 1) { this.socket.send(JSON.stringify(body)); }
  };

  Connection.prototype.connect = function () {
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    var socket = this.socket = new WebSocket(scheme + window.location.host + "/ws/live/");
    var self = this;
    socket.onopen = function () {
      self.backoff = 1000;
      var groups = self.groups();
      if (groups.length) { self.send({subscribe: groups}); }
      if (self.lost) { banner("Live updates are back.", true); }
      self.lost = false;
      document.documentElement.setAttribute("data-live", "open");
    };
    socket.onmessage = function (event) {
      var message;
      try { message = JSON.parse(event.data); } catch (e) { return; }
      if (message.type === "subscribed") {
        self.refetch(message.groups);  // whatever happened while we were away
      } else if (message.type === "revoked") {
        message.groups.forEach(function (g) { delete self.seq[g]; });
      } else if (message.group !== undefined) {
        self.apply(message);
      }
    };
    socket.onclose = function () {
      document.documentElement.setAttribute("data-live", "closed");
      self.lost = true;
      var wait = self.backoff * (0.5 + Math.random() / 2);
      banner("Live updates lost: reconnecting in " + Math.max(1, Math.round(wait / 1000)) +
        " s. What you see may be out of date.", false);
      // Reconnect with backoff (portal restart, network); the state is re-fetched on subscribe.
      setTimeout(function () { self.connect(); }, wait);
      self.backoff = Math.min(self.backoff * 2, 10000);
    };
  };

  Connection.prototype.add = function (subscription) {
    this.subscriptions.push(subscription);
    if (!this.socket) {
      this.connect();  // its groups go with the first frame, once open
    } else {
      this.join(subscription.groups);
    }
  };

  // Groups a subscription has just taken: asked for even if another holds them, so that the
  // server's "subscribed" answer re-reads their state for the newcomer.
  Connection.prototype.join = function (groups) {
    if (groups.length) { this.send({subscribe: groups}); }
  };

  // Groups a subscription has let go: the socket leaves those that nobody holds any more.
  Connection.prototype.leave = function (groups) {
    var self = this;
    var gone = groups.filter(function (g) { return !self.holds(g); });
    if (!gone.length) { return; }
    gone.forEach(function (g) { delete self.seq[g]; });
    this.send({unsubscribe: gone});
  };

  Connection.prototype.deliver = function (group, type, data, fromState) {
    this.subscriptions.forEach(function (s) {
      if (s.groups.indexOf(group) < 0) { return; }
      try {
        s.onUpdate(group, type, data, fromState);
      } catch (e) {
        window.console && window.console.error(e);  // one broken listener must not starve the others
      }
    });
  };

  Connection.prototype.apply = function (message) {
    var last = this.seq[message.group];
    if (last !== undefined && message.seq <= last) { return; }  // already in a fetched state
    if (last !== undefined && message.seq !== last + 1) {
      this.refetch([message.group]);
      return;
    }
    this.seq[message.group] = message.seq;
    this.deliver(message.group, message.type, message.data, false);
  };

  Connection.prototype.refetch = function (groups) {
    var self = this;
    var wanted = groups.filter(function (g) { return !self.refetching[g] && self.holds(g); });
    if (!wanted.length) { return; }
    wanted.forEach(function (g) { self.refetching[g] = true; });
    fetch("/telemetry/live/state/?groups=" + encodeURIComponent(wanted.join(",")), {credentials: "same-origin"})
      .then(function (response) { return response.ok ? response.json() : {groups: {}}; })
      .then(function (body) {
        Object.keys(body.groups).forEach(function (g) {
          var state = body.groups[g];
          self.seq[g] = state.seq;
          self.deliver(g, state.type, state.data, true);
        });
      })
      .catch(function () { /* the next reconnect or gap asks again */ })
      .finally(function () { wanted.forEach(function (g) { delete self.refetching[g]; }); });
  };

  var shared = null;
  function connection() {
    if (!shared) { shared = new Connection(); }
    return shared;
  }

  // ---- A subscription: what a page or the bell holds -------------------------------------------
  function Live(groups, onUpdate) {
    this.groups = groups.slice();
    this.onUpdate = onUpdate;  // onUpdate(group, type, data, fromState)
    connection().add(this);
  }

  Live.prototype.subscribe = function (groups) {
    var self = this;
    var fresh = groups.filter(function (g) { return self.groups.indexOf(g) < 0; });
    if (!fresh.length) { return; }
    this.groups = this.groups.concat(fresh);
    connection().join(fresh);
  };

  Live.prototype.unsubscribe = function (groups) {
    var self = this;
    var gone = groups.filter(function (g) { return self.groups.indexOf(g) >= 0; });
    if (!gone.length) { return; }
    this.groups = this.groups.filter(function (g) { return gone.indexOf(g) < 0; });
    connection().leave(gone);
  };

  Live.prototype.refetch = function (groups) {
    connection().refetch(groups);
  };

  Tessera.Live = Live;
  window.TesseraLive = Live;  // the name pages used before tessera.js
})();
