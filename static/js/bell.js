// The header's bell: its unread count follows the signed-in person's `user:<id>` group on the
// tab's one live socket (live.js: the page's own live updates share it; a gap or a reconnect
// re-reads the count from the live state).
(function () {
  "use strict";
  function start() {
    var bell = document.querySelector("[data-bell]");
    if (!bell || !window.Tessera || !window.Tessera.Live) { return; }
    var badge = bell.querySelector("[data-bell-count]");
    var group = bell.getAttribute("data-bell");
    function show(unread) {
      var before = parseInt(bell.getAttribute("data-unread") || "0", 10);
      bell.setAttribute("data-unread", String(unread));
      badge.textContent = unread > 99 ? "99+" : String(unread);
      badge.hidden = unread === 0;
      bell.setAttribute("aria-label", "Notifications: " + unread + " unread");
      if (unread > before) {
        bell.classList.remove("is-new");
        void bell.offsetWidth;  // restart the animation
        bell.classList.add("is-new");
      }
    }
    new window.Tessera.Live([group], function (name, type, data) {
      if (name === group && type === "notifications" && data && typeof data.unread === "number") {
        show(data.unread);
      }
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
