// The reservation page's terminal: xterm.js (loaded on the first click) over ws/terminal/<id>/.
// Keystrokes go as binary frames, the window size as {"type": "resize"} text; the shell's output
// comes as binary frames, the portal's words as {"type": "ready" | "closed" | "error"} text.
// xterm.js makes its own <style> elements; the page's policy admits only those carrying this
// response's style nonce, so every style element made on this page gets it at creation.
(function () {
  "use strict";

  var CHUNK = 32 * 1024; // a long paste goes in frames under the server's 64 KiB limit

  function load(src) {
    return new Promise(function (resolve, reject) {
      var script = document.createElement("script");
      script.src = src;
      script.onload = resolve;
      script.onerror = function () { reject(new Error("could not load " + src)); };
      document.head.appendChild(script);
    });
  }

  function stampStyles(nonce) {
    if (!nonce || document.createElement.tesseraStamped) { return; }
    var make = document.createElement;
    var stamped = function (name, options) {
      var element = make.call(document, name, options);
      if (String(name).toLowerCase() === "style") { element.setAttribute("nonce", nonce); }
      return element;
    };
    stamped.tesseraStamped = true;
    document.createElement = stamped;
  }

  // What a close code means when the portal said nothing before it (a refused handshake says nothing).
  function closedWords(code) {
    if (code === 1000) { return "Disconnected."; }
    if (code === 1006) { return "The terminal could not be reached, or this reservation is not yours."; }
    return "The terminal closed (code " + code + ").";
  }

  document.addEventListener("DOMContentLoaded", function () {
    var root = document.getElementById("terminal");
    if (!root) { return; }
    var id = root.getAttribute("data-reservation");
    var openButton = root.querySelector("[data-terminal-open]");
    var closeButton = root.querySelector("[data-terminal-close]");
    var status = root.querySelector("[data-terminal-status]");
    var screen = root.querySelector("[data-terminal-screen]");
    var term = null, fit = null, socket = null, said = "", ready = null;

    function setState(state, words) {
      root.setAttribute("data-terminal-state", state);
      if (words) { status.textContent = words; }
      var live = state === "connecting" || state === "open";
      openButton.hidden = live;
      closeButton.hidden = !live;
      openButton.textContent = state === "idle" ? "Connect terminal" : "Connect again";
    }

    function ensureTerminal() {
      if (ready) { return ready; }
      stampStyles(root.getAttribute("data-style-nonce"));
      ready = load(root.getAttribute("data-xterm"))
        .then(function () { return load(root.getAttribute("data-xterm-fit")); })
        .then(function () {
          screen.hidden = false;
          term = new window.Terminal({cursorBlink: true, fontSize: 14, lineHeight: 1.2, scrollback: 2000,
            fontFamily: "ui-monospace, SFMono-Regular, Menlo, Consolas, monospace"});
          fit = new window.FitAddon.FitAddon();
          term.loadAddon(fit);
          term.open(screen);
          // Shift+Tab leaves the terminal (Tab itself stays the shell's, for completion).
          term.attachCustomKeyEventHandler(function (event) {
            return !(event.key === "Tab" && event.shiftKey);
          });
          term.onData(function (data) {
            if (!socket || socket.readyState !== WebSocket.OPEN) { return; }
            var bytes = new TextEncoder().encode(data);
            for (var i = 0; i < bytes.length; i += CHUNK) { socket.send(bytes.subarray(i, i + CHUNK)); }
          });
          term.onResize(function (size) {
            if (socket && socket.readyState === WebSocket.OPEN) {
              socket.send(JSON.stringify({type: "resize", rows: size.rows, cols: size.cols}));
            }
          });
          var pending = null;
          window.addEventListener("resize", function () {
            clearTimeout(pending);
            pending = setTimeout(function () { fit.fit(); }, 150);
          });
          return term;
        });
      return ready;
    }

    function connect() {
      setState("connecting", "Connecting…");
      said = "";
      ensureTerminal().then(function () {
        screen.hidden = false;
        fit.fit();
        var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
        socket = new WebSocket(scheme + window.location.host + "/ws/terminal/" + id + "/?rows=" + term.rows +
          "&cols=" + term.cols);
        socket.binaryType = "arraybuffer";
        socket.onmessage = function (event) {
          if (typeof event.data !== "string") {
            term.write(new Uint8Array(event.data));
            return;
          }
          var message = JSON.parse(event.data);
          if (message.type === "ready") {
            setState("open", message.message + " Shift+Tab leaves the terminal.");
            term.focus();
          } else {
            said = message.message;
            status.textContent = said;
          }
        };
        socket.onclose = function (event) {
          var focused = root.contains(document.activeElement);
          socket = null;
          setState("closed", said || closedWords(event.code));
          if (event.code === 4410) { // the reservation ended: nothing left to connect to
            openButton.hidden = true;
          } else if (focused) {
            openButton.focus(); // the focus was on what just went away
          }
        };
      }).catch(function (error) {
        setState("closed", "The terminal could not start: " + error.message);
      });
    }

    openButton.addEventListener("click", connect);
    closeButton.addEventListener("click", function () {
      if (socket) {
        said = "Disconnected.";
        socket.close(1000);
      }
    });
  });
})();
