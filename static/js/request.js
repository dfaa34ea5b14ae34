// Request page: the feasibility preview is htmx (hx-get on the form, debounced); this file only
// keeps the limit from falling below the share while typing, and marks the preview as busy.
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", function () {
    var form = document.getElementById("request-form");
    if (!form) { return; }
    var preview = document.getElementById("preview");
    form.addEventListener("htmx:beforeRequest", function () { preview.setAttribute("aria-busy", "true"); });
    form.addEventListener("htmx:afterRequest", function () { preview.removeAttribute("aria-busy"); });
    // Choosing a team fetches the form again with that team's choices; choosing the team it already
    // shows must not, or what the user types meanwhile is replaced by the values sent with that request.
    var remember = function () {
      var team = document.getElementById("id_team");
      if (team) { team.setAttribute("data-loaded-team", team.value); }
    };
    remember();
    document.body.addEventListener("htmx:afterSettle", remember);
    document.body.addEventListener("htmx:confirm", function (evt) {
      var el = evt.detail.elt;
      if (el && el.id === "id_team" && el.value === el.getAttribute("data-loaded-team")) { evt.preventDefault(); }
    });
    // A free window offered after a booking conflict fills the booking's start and end.
    form.addEventListener("click", function (evt) {
      var button = evt.target.closest(".free-window");
      if (!button) { return; }
      var start = form.querySelector("#id_book_start");
      start.value = button.getAttribute("data-start");
      form.querySelector("#id_book_end").value = button.getAttribute("data-end");
      start.dispatchEvent(new Event("change", { bubbles: true }));  // the preview checks the new window
      start.focus();
    });
    var share = form.querySelector("#id_gpu_request");
    var limit = form.querySelector("#id_gpu_limit");
    if (share && limit) {
      share.addEventListener("change", function () { limit.min = share.value; });
      limit.min = share.value;
    }
  });
})();
