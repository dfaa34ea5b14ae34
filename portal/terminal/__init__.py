"""A terminal in a running reservation's pod, in the browser: `ws/terminal/<id>/`.

- `consumer`: the WebSocket (session auth, the owner only; bounded input, paced output, idle
  timeout; closed when the reservation stops running)
- `limits`: the bounds, each overridable in settings
- `slots`: at most N terminals per user across every portal process (the cache: Redis when set)
- `routing`: the route portal/asgi.py mounts

The shell itself comes from the cluster backend (`Backend.open_terminal`: the local backend's PTY,
Kubernetes' exec subresource). The page's end is templates/web/_terminal.html and
static/js/terminal.js (xterm.js, vendored).
"""
