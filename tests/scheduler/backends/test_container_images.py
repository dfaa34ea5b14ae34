"""The Dockerfile builds the images deploy/ runs: every image a manifest names is a build target,
every file it copies exists and is not ignored, every command a manifest runs exists in the image,
and the portal image's build step (collectstatic in the production profile) works.

No Docker engine here, so the images are not built; what can be checked without one is."""

from __future__ import annotations

import fnmatch
import importlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
IGNORED = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip()]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def instructions() -> list[tuple[str, str, str]]:
    """(stage, instruction, arguments), continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    out, stage = [], ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            stage = rest.split(" AS ")[-1].strip() if " AS " in rest else rest
        out.append((stage, word.upper(), rest.strip()))
    return out


def stages() -> dict[str, str]:
    """stage name → the stage it builds on."""
    return {rest.split(" AS ")[1].strip(): rest.split(" AS ")[0].strip()
            for _, word, rest in instructions() if word == "FROM" and " AS " in rest}


def in_stage(target: str) -> list[tuple[str, str]]:
    """The instructions that make `target`, its base stages' first."""
    chain, name, all_stages = [], target, stages()
    while name in all_stages:
        chain.insert(0, name)
        name = all_stages[name]
    return [(word, rest) for stage, word, rest in instructions() if stage in chain]


def ignored(path: str) -> bool:
    return any(fnmatch.fnmatch(path, pattern) or path.startswith(pattern.rstrip("/") + "/") for pattern in IGNORED)


def manifest_containers() -> list[dict]:
    out = []
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        if "inventory" in path.parts or path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            spec = (doc or {}).get("spec", {})
            pod = spec.get("template", {}).get("spec", spec.get("jobTemplate", {}).get("spec", {})
                                              .get("template", {}).get("spec", {}))
            out += pod.get("initContainers", []) + pod.get("containers", [])
    return out


def test_every_image_a_manifest_runs_is_a_target_of_this_version():
    ours = {c["image"] for c in manifest_containers() if c["image"].startswith("tessera/")}
    assert ours == {f"tessera/portal:{PROJECT['version']}", f"tessera/agent:{PROJECT['version']}"}
    for image in ours:
        assert image.split("/")[1].split(":")[0] in stages()


def test_every_copied_path_exists_and_is_not_ignored():
    copies = [rest for _, word, rest in instructions() if word == "COPY" and not rest.startswith("--from")]
    assert copies
    for rest in copies:
        *sources, _dest = shlex.split(rest)
        for source in sources:
            assert (ROOT / source).exists(), source
            assert not ignored(source), f"{source} is in .dockerignore"


def test_the_agent_image_holds_the_preload_library_where_the_installer_copies_it_from():
    install = next(c for c in manifest_containers() if c["name"] == "install-preload")
    copied_from = re.search(r"cp (\S+) ", " ".join(install["command"])).group(1)
    agent_copies = [rest for word, rest in in_stage("agent") if word == "COPY" and rest.startswith("--from=preload")]
    assert any(rest.split()[-1] == copied_from for rest in agent_copies), agent_copies
    assert any("make -C preload" in rest for word, rest in in_stage("preload") if word == "RUN")


def test_every_command_a_manifest_runs_is_in_its_image():
    scripts = set(PROJECT["scripts"]) | {"python", "daphne", "celery", "gunicorn", "sh"}
    for container in manifest_containers():
        if not container["image"].startswith("tessera/"):
            continue
        command = container.get("command") or []
        assert command, f"{container['name']}: the image's CMD is only for trying it out"
        if command[0].startswith("/"):  # a binary the image's stage copies in (the remote server)
            target = container["image"].split("/")[1].split(":")[0]
            folders = [rest.split()[-1] for word, rest in in_stage(target) if word == "COPY"]
            assert any(command[0].startswith(f) for f in folders if f.endswith("/")), (command, folders)
            continue
        assert command[0] in scripts, command
        if command[:2] == ["python", "-m"]:
            assert importlib.util.find_spec(command[2]) is not None, command
        if command[0] == "gunicorn":  # its settings are a module of ours: -c python:MODULE
            assert importlib.util.find_spec(command[command.index("-c") + 1].removeprefix("python:")), command
        if command[:2] == ["python", "manage.py"]:
            assert container["image"].startswith("tessera/portal"), "manage.py is only in the portal image"
    for name, target in PROJECT["scripts"].items():
        module, _, function = target.partition(":")
        assert hasattr(importlib.import_module(module), function), name


def test_the_portal_build_step_collects_the_static_files_in_the_production_profile(tmp_path):
    """The portal stage's COPY lines, replayed into a folder, are enough for its collectstatic step."""
    app = tmp_path / "app"
    app.mkdir()
    for word, rest in in_stage("portal"):
        if word == "COPY" and not rest.startswith("--from"):
            *sources, dest = shlex.split(rest)
            for source in sources:
                target = app / (Path(source).name if dest in ("./", ".") else dest)
                if (ROOT / source).is_dir():
                    shutil.copytree(ROOT / source, target, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(ROOT / source, target)
    run = next(rest for word, rest in in_stage("portal") if word == "RUN" and "collectstatic" in rest)
    env_part, _, command = run.partition("python ")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    env.update(dict(item.split("=", 1) for item in shlex.split(env_part)))
    result = subprocess.run([sys.executable, *shlex.split(command)], cwd=app, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    manifest = app / "var" / "staticfiles" / "staticfiles.json"
    assert manifest.exists() and "css/" in manifest.read_text()


def test_the_preload_stage_copies_every_source_the_build_reads_and_builds_each_runtime_major():
    """`make -C preload` in the image reads only what the stage copied in (it lacked preload/common
    once, and the image did not build); the client runtime is built for CUDA 12 and 13 programs."""
    dry = subprocess.run(["make", "-s", "-n", "-B", "-C", str(ROOT / "preload"), "all"], capture_output=True,
                         text=True, check=True).stdout
    read = {path.split("/")[0] for path in re.findall(r"(?<![\w/.-])((?:[\w-]+/)+[\w-]+\.[ch])\b", dry)}
    copied = {shlex.split(rest)[0].split("/")[1] for word, rest in in_stage("preload")
              if word == "COPY" and rest.startswith("preload/")}
    assert read and read <= copied, f"the preload stage lacks {sorted(read - copied)}"
    runs = " ".join(rest for word, rest in in_stage("preload") if word == "RUN")
    assert "make -C preload CUDA_HOME=/usr/local/cuda" in runs  # this stage's CUDA 12: libcudart.so.12
    assert "CUDA_HOME=/opt/cuda-13 build/remote/client/libcudart.so.13" in runs
    assert any(rest.startswith("--from=cuda13 /usr/local/cuda/include /opt/cuda-13/include")
               for word, rest in in_stage("preload") if word == "COPY")
