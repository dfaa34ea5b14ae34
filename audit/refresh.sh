#!/bin/sh
# Refresh the vendored advisories from a checkout of https://github.com/pypa/advisory-database:
#   audit/refresh.sh /path/to/advisory-database
# Copies vulns/<package>/ for every package installed in the project's environment, and records
# the commit in audit/SNAPSHOT. Review the diff, then run `python -m audit.dependency_audit`.
set -eu
src=${1:?path to a checkout of pypa/advisory-database}
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python}
rm -rf "$here/advisories/pypi"
mkdir -p "$here/advisories/pypi"
$py -c 'import importlib.metadata as m, re; print("\n".join(sorted({re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower() for d in m.distributions()})))' |
while read -r name; do
    if [ -d "$src/vulns/$name" ]; then cp -r "$src/vulns/$name" "$here/advisories/pypi/$name"; fi
done
commit=$(git -C "$src" log -1 --format=%H)
date=$(git -C "$src" log -1 --format=%cs)
sed -i "s/^commit: .*/commit: $commit/; s/^commit date: .*/commit date: $date/" "$here/SNAPSHOT"
