"""The simulated fleet's node tokens file: node name → its agent token, one `name: token` line
each (YAML). The portal writes it (`manage.py agent_tokens`, the demo, a rotation in the demo) and the
simulated fleet (agents.fleet) reads it, so both keep to this one reader and writer."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from wire.agent_portal import TOKEN_PATTERN


def read_tokens(path: Path) -> dict[str, str]:
    """node name -> token; raises ValueError naming the file and the entry at fault."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{path}: must map node names to tokens")
    tokens = {}
    for node, token in data.items():
        if not isinstance(token, str) or not re.fullmatch(TOKEN_PATTERN, token):
            raise ValueError(f"{path}: {node}: a node token is 1 to 512 printable characters without spaces")
        tokens[str(node)] = token
    return tokens


def format_tokens(tokens: dict[str, str]) -> str:
    """The file's text for `tokens`, a line per node in name order (quoted where YAML needs it)."""
    return yaml.safe_dump(dict(tokens), sort_keys=True, default_flow_style=False)
