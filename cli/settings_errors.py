"""The line `fp8serve serve` prints when service.settings.Settings refuses a value: named as
the operator gave it, the flag with its value (``--max-num-seqs 0``) or the environment
variable (``FP8SERVE_MAX_NUM_SEQS='abc'``), not the Settings field (``max_num_seqs``) nor
pydantic's ``Value error,`` prefix. Secrets (API keys, the signing key) are named, never
echoed."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from service.settings import Settings

ENV_PREFIX = Settings.model_config["env_prefix"]  # one spelling: the settings' own
SECRET_FIELDS = frozenset({"api_keys", "thinking_signature_key"})
# Settings fields whose flag is not the field's name spelled with dashes
FLAG_OF = {"api_keys": "--api-key", "disabled_kernels": "--disable-kernel"}
# what a boolean environment variable takes (pydantic's words for true and false)
BOOL_WORDS = "true or false (1/0, yes/no, on/off)"


def flag_name(field: str) -> str:
    """The `fp8serve serve` flag that sets a Settings field."""
    return FLAG_OF.get(field, "--" + field.replace("_", "-"))


def env_name(field: str) -> str:
    """The environment variable that sets a Settings field."""
    return ENV_PREFIX + field.upper()


def settings_error(exc: ValidationError, flags_given: Mapping[str, Any]) -> str:
    """One line for the first of ``exc``'s errors. ``flags_given``: field -> value of the
    fields a flag set (the others came from the environment)."""
    first = exc.errors()[0]
    msg = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "bool_parsing":
        msg = f"expected {BOOL_WORDS}"
    if not first["loc"]:  # a check across fields: its message names the flags
        return msg
    field = str(first["loc"][0])
    flag = flag_name(field)
    if msg.startswith(flag + " "):  # the check named the flag and value itself
        msg = msg.split(": ", 1)[-1]
    secret = field in SECRET_FIELDS
    # the whole value as given, also where the error is about one item of a list
    if field in flags_given:
        where = flag if secret else f"{flag} {_shown(flags_given[field])}"
    else:
        value = os.environ.get(env_name(field), first.get("input"))
        where = env_name(field) if secret else f"{env_name(field)}={value!r}"
    return f"{where}: {msg}"


def _shown(value: Any) -> str:
    """A flag's value as typed: list flags' items separated by spaces; '' for none."""
    if isinstance(value, (tuple, list)):
        value = " ".join(map(str, value))
    return str(value) or "''"
