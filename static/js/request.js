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
    var share = form.querySelector("#id_gpu_request");
    var limit = form.querySelector("#id_gpu_limit");
    if (share && limit) {
      share.addEventListener("change", function () { limit.min = share.value; });
      limit.min = share.value;
    }
  });
})();
