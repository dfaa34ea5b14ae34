// The fleet page, live over /ws/live/ (site admins only, checked by the server at subscribe):
// - "fleet": a "nodes" message names nodes whose state, cordons or shares changed; the page
//   fetches the server-rendered rows of those it shows (/fleet/rows/) and swaps them in, and
//   leaves every other node alone (500 nodes: a page shows 20);
// - "gpu:<id>" for each GPU on screen: its utilization bar and text, and the node's "seen … ago".
// After a (re)subscription or a gap the rows on screen are fetched again, unless the page was
// drawn after the last change announced. The cordon buttons open one dialog that asks for a reason.
(function () {
  "use strict";
  var live = null;
  var readings = {};  // gpu id -> last reading (a swapped-in row starts with it)
  var wanted = {};    // node ids waiting to be fetched (one request for a burst of messages)
  var timer = null;

  function list() { return document.querySelector("ol.fleet"); }

  function groups() {
    var ol = list();
    if (!ol || !ol.getAttribute("data-gpus")) { return ["fleet"]; }
    return ["fleet"].concat(ol.getAttribute("data-gpus").split(",").map(function (id) { return "gpu:" + id; }));
  }

  function ago(ms) {
    var s = Math.max(0, Math.round((Date.now() - ms) / 1000));
    if (s < 60) { return s + " s"; }
    if (s < 3600) { return Math.round(s / 60) + " min"; }
    return Math.round(s / 3600) + " h";
  }

  function seen(row, ms) {
    var el = row && row.querySelector("[data-seen]");
    if (!el) { return; }
    if (ms) {
      if (Number(el.getAttribute("data-seen-ms") || 0) >= ms) { return; }
      el.setAttribute("data-seen-ms", String(ms));
    }
    var at = Number(el.getAttribute("data-seen-ms") || 0);
    if (at) { el.textContent = "seen " + ago(at) + " ago"; }
  }

  function showUtil(cell, data) {
    var pct = Math.max(0, Math.min(100, Number(data.sm_util_pct) || 0));
    var bar = cell.querySelector("[data-util]");
    if (bar) { bar.setAttribute("width", String(pct)); }  // an attribute, not a style: CSP-safe
    var text = cell.querySelector("[data-util-text]");
    if (text) { text.textContent = Math.round(pct) + " %"; }
    cell.setAttribute("data-util-pct", String(Math.round(pct)));
  }

  function onGpu(id, data) {
    readings[id] = data;
    var cell = document.querySelector('[data-gpu="' + id + '"]');
    if (!cell) { return; }
    showUtil(cell, data);
    if (data.ts_ms) { seen(cell.closest("li.node"), data.ts_ms); }
  }

  function onScreen(ids) {
    var shown = {};
    allOnScreen().forEach(function (id) { shown[id] = true; });
    return ids.filter(function (id) { return shown[id]; });
  }

  function fetchRows() {
    timer = null;
    var ids = onScreen(Object.keys(wanted));
    wanted = {};
    if (!ids.length) { return; }
    var url = "/fleet/rows/?ids=" + ids.join(",") + "&next=" +
      encodeURIComponent(window.location.pathname + window.location.search);
    fetch(url, {credentials: "same-origin", headers: {"HX-Request": "true"}})
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (html === null) { return; }
        var holder = document.createElement("div");
        holder.innerHTML = html;
        var summary = holder.querySelector("#fleet-summary");
        var current = document.getElementById("fleet-summary");
        if (summary && current) { current.textContent = summary.textContent; }
        var fresh = [];
        var back = {};
        holder.querySelectorAll("li.node[data-node-id]").forEach(function (row) {
          back[row.getAttribute("data-node-id")] = true;
        });
        ids.forEach(function (id) {  // no longer kept by the page's filters: off the page, said once
          var old = back[id] ? null : document.querySelector('li.node[data-node-id="' + id + '"]');
          if (!old) { return; }
          old.remove();
          window.Tessera.toast(old.getAttribute("data-node") + " no longer matches the filters.", "info");
        });
        holder.querySelectorAll("li.node[data-node-id]").forEach(function (row) {
          var old = document.querySelector('li.node[data-node-id="' + row.getAttribute("data-node-id") + '"]');
          if (!old) { return; }
          var seenBefore = old.querySelector("[data-seen]");
          old.replaceWith(row);
          if (seenBefore && seenBefore.getAttribute("data-seen-ms")) {
            seen(row, Number(seenBefore.getAttribute("data-seen-ms")));
          }
          row.querySelectorAll("[data-gpu]").forEach(function (cell) {
            var id = cell.getAttribute("data-gpu");
            if (readings[id]) { showUtil(cell, readings[id]); } else { fresh.push("gpu:" + id); }
          });
        });
        if (fresh.length && live) { live.subscribe(fresh); live.refetch(fresh); }  // a GPU new to the page
      })
      .catch(function () { /* the next message or reconnect asks again */ });
  }

  function ask(ids) {
    ids.forEach(function (id) { wanted[id] = true; });
    if (!timer) { timer = setTimeout(fetchRows, 150); }  // a burst of commits: one request
  }

  function allOnScreen() {
    var ids = [];
    document.querySelectorAll("li.node[data-node-id]").forEach(function (row) {
      ids.push(row.getAttribute("data-node-id"));
    });
    return ids;
  }

  function onUpdate(group, type, data, fromState) {
    if (!data) { return; }
    if (type === "gpu") {
      onGpu(group.slice(4), data);
    } else if (type === "nodes") {
      if (data.all) {
        // A state: every node may have changed up to data.seq, unless the list was drawn at it.
        var ol = list();
        if (ol && Number(ol.getAttribute("data-live-seq")) >= data.seq) { return; }
        ask(allOnScreen());
      } else {
        ask(data.changed.map(String));
      }
    }
  }

  function start() {
    var names = groups();
    if (!window.Tessera || !window.Tessera.Live || !window.WebSocket) { return; }
    if (live) {
      // Another page or filter: the GPUs no longer shown are left (a socket holds 200 groups).
      live.unsubscribe(live.groups.filter(function (g) { return names.indexOf(g) < 0; }));
      live.subscribe(names);
      live.refetch(names);  // redrawn cells start empty: fill them from the current state
      return;
    }
    live = new window.Tessera.Live(names, onUpdate);
  }

  // ---- Cordon with a reason ---------------------------------------------------------------------
  function openCordon(button) {
    var dialog = document.getElementById("cordon-dialog");
    var cell = button.closest("[data-gpu]");
    if (!dialog || !cell) { return; }
    var form = dialog.querySelector("form");
    var cordon = button.getAttribute("data-cordon") === "1";
    var where = button.getAttribute("data-where");
    form.setAttribute("action", "/fleet/gpus/" + cell.getAttribute("data-gpu") + "/cordon/");
    form.querySelector("[name=next]").value = window.location.pathname + window.location.search;
    form.querySelector("[name=cordon]").value = cordon ? "1" : "0";
    var reason = form.querySelector("[name=reason]");
    reason.value = "";
    reason.required = cordon;
    form.querySelector("[data-reason-field]").hidden = !cordon;
    dialog.querySelector("#cordon-title").textContent = (cordon ? "Cordon " : "Uncordon ") + where;
    dialog.querySelector("[data-question]").textContent = cordon ?
      "No new shares will land on " + where + "; its shares keep running." :
      "New shares may land on " + where + " again.";
    form.querySelector("[data-verb]").textContent = cordon ? "Cordon" : "Uncordon";
    dialog.showModal();
    if (cordon) { reason.focus(); }
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-cordon]");
    if (button) { openCordon(button); return; }
    var cancel = event.target.closest("#cordon-dialog [data-cancel]");
    if (cancel) { document.getElementById("cordon-dialog").close(); }
  });

  document.addEventListener("DOMContentLoaded", function () {
    start();
    setInterval(function () {  // "seen … ago" moves on between readings
      if (document.hidden) { return; }
      document.querySelectorAll("li.node").forEach(function (row) { seen(row, 0); });
    }, 5000);
  });
  document.addEventListener("htmx:afterSwap", function (event) {
    if (event.detail.target && event.detail.target.id === "nodes") { start(); }
  });
})();
