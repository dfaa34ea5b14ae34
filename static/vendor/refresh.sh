#!/usr/bin/env bash
# Refresh the vendored browser assets from the npm registry at the pinned versions below and
# record what was taken (package, version, licence, file, sha256) in MANIFEST.json.
# Run from anywhere: static/vendor/refresh.sh. Needs npm (for `npm pack`) and python3.
# Change a version here, run this, look at the diff, commit: pages never load anything from a CDN.
set -euo pipefail

HTMX_VERSION=2.0.8
UPLOT_VERSION=1.6.32
XTERM_VERSION=6.0.0
XTERM_FIT_VERSION=0.11.0

here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

fetch() {  # fetch <package> <version>: unpack the registry tarball under $work/<package>
  local pkg="$1" version="$2"
  mkdir -p "$work/$pkg"
  (cd "$work/$pkg" && npm pack --silent "$pkg@$version" >/dev/null && tar -xzf ./*.tgz)
}

fetch htmx.org "$HTMX_VERSION"
fetch uplot "$UPLOT_VERSION"
fetch @xterm/xterm "$XTERM_VERSION"
fetch @xterm/addon-fit "$XTERM_FIT_VERSION"

mkdir -p "$here/htmx" "$here/uplot" "$here/xterm" "$here/xterm-addon-fit"
cp "$work/htmx.org/package/dist/htmx.min.js" "$here/htmx/htmx.min.js"
cp "$work/htmx.org/package/LICENSE" "$here/htmx/LICENSE"
cp "$work/uplot/package/dist/uPlot.iife.min.js" "$here/uplot/uPlot.iife.min.js"
cp "$work/uplot/package/dist/uPlot.min.css" "$here/uplot/uPlot.min.css"
cp "$work/uplot/package/LICENSE" "$here/uplot/LICENSE"
cp "$work/@xterm/xterm/package/lib/xterm.js" "$here/xterm/xterm.js"
# The source maps the files name at their end: collectstatic's manifest follows that reference.
cp "$work/@xterm/xterm/package/lib/xterm.js.map" "$here/xterm/xterm.js.map"
cp "$work/@xterm/xterm/package/css/xterm.css" "$here/xterm/xterm.css"
cp "$work/@xterm/xterm/package/LICENSE" "$here/xterm/LICENSE"
cp "$work/@xterm/addon-fit/package/lib/addon-fit.js" "$here/xterm-addon-fit/addon-fit.js"
cp "$work/@xterm/addon-fit/package/lib/addon-fit.js.map" "$here/xterm-addon-fit/addon-fit.js.map"
cp "$work/@xterm/addon-fit/package/LICENSE" "$here/xterm-addon-fit/LICENSE"

python3 - "$here" "$work" <<'PY'
import hashlib, json, pathlib, sys
here, work = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
entries = []
for pkg, folder in (("htmx.org", "htmx"), ("uplot", "uplot"), ("@xterm/xterm", "xterm"),
                    ("@xterm/addon-fit", "xterm-addon-fit")):
    meta = json.loads((work / pkg / "package" / "package.json").read_text())
    files = sorted(p for p in (here / folder).iterdir() if p.is_file())
    entries.append({
        "package": pkg, "version": meta["version"], "license": meta.get("license"),
        "homepage": meta.get("homepage"), "folder": folder,
        "files": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files},
    })
(here / "MANIFEST.json").write_text(json.dumps({"source": "registry.npmjs.org via npm pack",
                                                 "packages": entries}, indent=2) + "\n")
PY
echo "vendored: htmx.org $HTMX_VERSION, uplot $UPLOT_VERSION, @xterm/xterm $XTERM_VERSION," \
     "@xterm/addon-fit $XTERM_FIT_VERSION (see static/vendor/MANIFEST.json)"
