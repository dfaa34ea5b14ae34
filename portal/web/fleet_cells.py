"""The HTML of one GPU in the fleet view, built in Python rather than in the template: a page
draws 160 GPUs and hundreds of share slices, and the template engine spent ~3 ms on each GPU
(bench/web/fleet.py), most of the page's time. Every value is escaped here; the markup is the
one templates/fleet/_node.html documents. SVG's own short forms (self-closed rects, x and y 0 left
out) keep the 160 GPUs of a page some 20 KB smaller."""

from __future__ import annotations

from functools import lru_cache

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from .templatetags import tessera

# A page repeats the same few shares and sizes hundreds of times: format each value once.
share = lru_cache(maxsize=4096)(tessera.share)
gib = lru_cache(maxsize=4096)(tessera.gib)


def _slice_title(s: dict) -> str:
    limit = f"–{share(s['limit'])}" if s["limit"] != s["share"] else ""
    remote = f", remote from {s['remote_from']}" if s.get("remote_from") else ""
    return (f"#{s['reservation']} {s['owner']} ({s['team']}): {share(s['share'])}{limit} of the GPU, "
            f"{gib(s['memory_mib'])}, {s['state']}{remote}")


def gpu_cell(g: dict, node: str) -> SafeString:
    idx = g["index"]
    classes = "gpu" + (" cordoned" if g["cordoned"] else "") + ("" if g["healthy"] else " unhealthy")
    badges = (' <span class="badge tone-warn">cordoned</span>' if g["cordoned"] else "") + \
        ("" if g["healthy"] else ' <span class="badge tone-bad">unhealthy</span>')
    # Why it is cordoned (a site admin's reason, or a GPU its agent reported that awaits approval).
    reason = f'<small class="cordon-reason">{escape(g["cordon_reason"])}</small>' if g["cordoned"] and \
        g["cordon_reason"] else ""
    used, memory = share(g["used"]), gib(g["memory_used"])
    label = "" if g.get("model_label", g["model"]) == g["model"] else (
        f' <code class="muted" title="as a label value, for sharedgpu/gpu_model">{escape(g["model_label"])}</code>')
    slices = []
    bars = []
    for s in g["slices"]:
        href = f"/reservations/{s['reservation']}/"
        slices.append(f'<a href="{href}" data-reservation="{s["reservation"]}"><title>{escape(_slice_title(s))}'
                      f'</title><rect class="slice {s["cls"]}" x="{s["x"]}" width="{s["w"]}" height="11"/></a>')
        bars.append(f'<rect class="mem {s["cls"]}" x="{s["mx"]}" y="14" width="{s["mw"]}" height="6"/>')
    where = f"GPU {idx} on {escape(node)}"
    foot = f"{used} · {memory}" if g["slices"] else "free"
    # Remote shares said in words: the pod runs on another node and uses this GPU over the network.
    remote = "".join(
        f'<li><a href="/reservations/{s["reservation"]}/">#{s["reservation"]}</a> remote: '
        f'{escape(s["remote_from"])} → GPU {idx}</li>' for s in g["slices"] if s.get("remote_from"))
    if remote:
        reason += f'<ul class="remote-shares" aria-label="Remote shares of {where}">{remote}</ul>'
    return mark_safe(  # noqa: S308 (every outside value above is escaped or a number)
        f'<li class="{classes}" data-gpu="{g["id"]}" data-index="{idx}">'
        f'<div class="gpu-head"><strong>GPU {idx}</strong> <span class="muted">{escape(g["model"])}</span>'
        f"{label}{badges}</div>"
        f'<svg class="gpu-bars" viewBox="0 0 100 26" preserveAspectRatio="none" role="group" aria-label="{where}: '
        f'{used} of 1 shared, {memory} of {gib(g["memory_mib"])}">'
        '<rect class="cap" width="100" height="11"/>' + "".join(slices) +
        '<rect class="cap" y="14" width="100" height="6"/>' + "".join(bars) +
        '<rect class="util-cap" y="23" width="100" height="3"/>'
        '<rect class="util" y="23" width="0" height="3" data-util/></svg>'
        f'<div class="gpu-foot"><span>{foot}</span> <span class="muted" data-util-text title="utilization now">—'
        f"</span></div>{reason}"
        # One dialog on the page holds the form (and the only CSRF token): it asks for the reason.
        f'<button type="button" class="link gpu-action" data-cordon="{"0" if g["cordoned"] else "1"}" '
        f'data-where="{where}">{"Uncordon" if g["cordoned"] else "Cordon"}</button></li>'
    )
