"""Finding and loading profiles: the shipped ones by name, a user file by path, ``auto`` by the
GPUs' NVML product names.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Sequence
from importlib import resources

from gpu_monitor.profiles.profile import Profile
from gpu_monitor.profiles.profile_schema import ProfileError, validate_profile
from gpu_monitor.profiles.schema import suggest
from gpu_monitor.profiles.yaml_reader import read_text, read_yaml


def _shipped_dir():
    return resources.files("gpu_monitor.profiles")


def list_profiles() -> list[str]:
    """Names of the profiles shipped with gpu-monitor."""
    return sorted(p.name[: -len(".yaml")] for p in _shipped_dir().iterdir()
                  if p.name.endswith(".yaml"))


def _looks_like_path(ref: str) -> bool:
    return os.sep in ref or "/" in ref or ref.endswith((".yaml", ".yml"))


def load_profile(name_or_path: str | os.PathLike[str]) -> Profile:
    """A shipped profile by name (``h100-sxm-8``) or a user file (a baseline measured on
    known-good nodes, e.g. for B200, where no public floors exist)."""
    ref = os.fspath(name_or_path)
    if _looks_like_path(ref):
        source = f"profile {ref}"
        text = read_text(ref, source, ProfileError)
        return Profile(validate_profile(read_yaml(text, source, ProfileError), source), ref)
    return _load_shipped(ref)


@functools.cache
def _load_shipped(name: str) -> Profile:
    source = f"profile {name}"
    names = list_profiles()
    if name not in names:
        hint = suggest(name, names, cutoff=0.5)
        msg = f"unknown profile {name!r}; shipped profiles: {', '.join(names)}"
        raise ProfileError(source, [("", msg + (f" (did you mean {hint!r}?)" if hint else ""))])
    text = _shipped_dir().joinpath(f"{name}.yaml").read_text(encoding="utf-8")
    data = validate_profile(read_yaml(text, source, ProfileError), source)
    if data["name"] != name:
        raise ProfileError(source, [("name", f"{data['name']!r} differs from the file name "
                                             f"{name + '.yaml'!r}")])
    return Profile(data, f"gpu_monitor/profiles/{name}.yaml")


def _match_score(profile: Profile, gpu_names: Sequence[str]) -> int | None:
    """How specifically ``profile`` matches every name (longest pattern hit), or None."""
    patterns = [str(p).lower() for p in profile.get("match", ())]
    excludes = [str(p).lower() for p in profile.get("match_exclude", ())]
    if not gpu_names:
        return 0 if profile.expected_gpus == 0 and not patterns else None
    score: int | None = None
    for raw in gpu_names:
        name = raw.lower()
        if any(x in name for x in excludes):
            return None
        hits = [len(p) for p in patterns if p in name]
        if not hits:
            return None
        score = max(hits) if score is None else min(score, max(hits))
    return score


def match_profile(gpu_names: Sequence[str],
                  candidates: Iterable[Profile] | None = None) -> Profile | None:
    """``--profile auto``: the profile whose ``match`` substrings hit every GPU's NVML product
    name (case-insensitive) and whose ``match_exclude`` hits none. No GPUs -> the profile
    expecting 0 GPUs (cpu-only). Several matches -> the most specific (longest pattern);
    equal -> the first candidate (shipped profiles are in name order). None when nothing
    matches, e.g. a mixed node or an unknown SKU."""
    pool = list(candidates) if candidates is not None else [
        _load_shipped(n) for n in list_profiles()]
    best: tuple[int, Profile] | None = None
    for profile in pool:
        score = _match_score(profile, list(gpu_names))
        if score is not None and (best is None or score > best[0]):
            best = (score, profile)
    return best[1] if best else None
