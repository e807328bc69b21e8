"""Loading hardware presets (``hwconfigs/*.yaml``) and applying overrides.

A GPU preset lives in ``hwconfigs/gpus/NAME.yaml``; a node preset in ``hwconfigs/nodes/NAME.yaml``
names its GPU preset (``gpu: v100-sxm2``) or describes it inline.  Any description (a preset, a
user's file, an inline GPU) may start from another preset with ``base: NAME`` (or a YAML path
relative to the file) and give only what differs: its mappings are merged into the base's, its
other values replace the base's, and its ``sources`` come before the base's.  Overrides are dotted
paths into the system description: ``{"gpu.num_cus": 160, "links.bandwidth": "300 GB/s"}``.  A path
may drop the unit suffix of a field (``links.bandwidth`` for ``links.bandwidth_bytes_per_s``); the
value must then say its unit.  A description's keys may drop it too (``links: {bandwidth: 300
GB/s}``).  A value may also be the text a user typed (``"160"``, ``"true"``, ``"0.5"``): it is
read as the field's type, so a text field keeps it as typed (``gpu.name="007"``) and a list field
reads it as a YAML list (``topology.edges="[[0, 1], [1, 2]]"``).

An override changes one field and keeps the rest of its section.  Where the description leaves a
section out, the override starts from the section's defaults (``gpu.nmc.op_cycles.div=2`` keeps
the other operations' costs; ``topology.links_per_pair=2`` keeps the default topology's kind).
Where it leaves an optional section empty (``null`` or absent, as ``network`` of a one-node preset
or ``gpu.gemm_tma`` of a GPU without TMA), an override into it creates the section, with its other
fields at their defaults: that switches on what the section describes (``gpu.gemm_tma.cluster_size=2``
gives such a GPU TMA kernels with clusters of two), and the section's required fields must come in
overrides too (``network.latency`` alone is an error naming the override, the section it created,
and ``network.nic_bandwidth_bytes_per_s``).
"""

from __future__ import annotations

import copy
import difflib
import os
import types
import typing
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from gpusim.config.gpu import GpuConfig
from gpusim.config.node import SystemConfig
from gpusim.config.quantities import UNIT_SUFFIXES
from gpusim.data_paths import data_root
from gpusim.errors import ConfigError, NoEffectWarning, UnknownPresetError
from gpusim.units import QuantityError, parse_quantity

HWCONFIG_ENV = "GPUSIM_HWCONFIGS"


def hwconfig_dirs() -> list[Path]:
    """Folders searched for presets: ``$GPUSIM_HWCONFIGS`` (os.pathsep-separated), then the repository's."""
    dirs = [Path(p) for p in os.environ.get(HWCONFIG_ENV, "").split(os.pathsep) if p]
    dirs.append(data_root() / "hwconfigs")
    return dirs


def _preset_files(kind: str) -> dict[str, Path]:
    files: dict[str, Path] = {}
    for root in reversed(hwconfig_dirs()):
        folder = root / kind
        if folder.is_dir():
            for path in sorted(folder.glob("*.yaml")):
                files[path.stem] = path
    return files


def list_presets() -> dict[str, list[str]]:
    """Names of the known presets, as ``{"gpus": [...], "nodes": [...]}``."""
    return {"gpus": sorted(_preset_files("gpus")), "nodes": sorted(_preset_files("nodes"))}


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _check_unique_keys(node: yaml.Node, path: Path, keys: list[str], seen: set[int]) -> None:
    """Raise for a key given twice in one mapping of the YAML tree ``node`` (at dotted ``keys``).

    PyYAML keeps the last of such keys without a word.  Keys a merge (``<<: *anchor``) brings in may
    be given again: that is how a merge is overridden.  ``seen`` holds the nodes already checked (an
    alias repeats its anchor's node).
    """
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first_line: dict[tuple[str, str], int] = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                key = (key_node.tag, key_node.value)
                line = key_node.start_mark.line + 1
                if key in first_line:
                    field = ".".join([*keys, key_node.value])
                    raise ConfigError(
                        f"{path}: field '{field}' is given twice (lines {first_line[key]} and {line}); remove one"
                    )
                first_line[key] = line
            _check_unique_keys(value_node, path, [*keys, str(key_node.value)], seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _check_unique_keys(item, path, [*keys, str(index)], seen)


def _read_yaml(path: Path) -> dict[str, Any]:
    """The mapping of fields that the YAML file ``path`` holds.

    Raises
    ------
    ConfigError
        Naming the file: it cannot be read (a folder, say), is not UTF-8 text (the message gives
        the line), is not valid YAML (the line and column), gives a key twice, or holds no mapping
        (an empty file, a list).
    """
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        line = exc.object.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path}: line {line}: not UTF-8 text (byte {exc.object[exc.start]:#04x}); "
                          f"save the file as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from exc
    try:
        loader = yaml.SafeLoader(text)
        loader.name = str(path)  # YAML's messages name the file, not "<unicode string>"
        try:
            node = loader.get_single_node()
            if node is not None:
                _check_unique_keys(node, path, [], set())
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.reader.ReaderError as exc:  # a control character, found before the loader is named
        line = text.count("\n", 0, exc.position) + 1
        raise ConfigError(f"{path}: line {line}: not valid YAML: character {exc.character:#06x}: {exc.reason}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        got = "nothing (the file is empty)" if data is None else f"a {type(data).__name__}"
        raise ConfigError(f"{path}: expected a mapping of fields at the top level, got {got}")
    return data


_GPU_ONLY = tuple(f for f in GpuConfig.model_fields if f not in SystemConfig.model_fields)
"""Fields that only a GPU's description has (``num_cus``, ``l2``...)."""
_NODE_ONLY = tuple(f for f in SystemConfig.model_fields if f not in GpuConfig.model_fields)
"""Fields that only a node's description has (``gpu``, ``num_gpus``, ``topology``...)."""


def _is_gpu_description(data: dict[str, Any], path: Path) -> bool:
    """Whether the description in the file ``path`` is of a GPU (else of a node).

    A node's names its GPU (``gpu``); otherwise the fields that only one of the two has tell,
    whether or not some are misspelled or missing, so that the errors that follow are the right
    model's.  A description with fields of both, or of neither, is an error.
    """
    if "gpu" in data:
        return False
    gpu_fields = sorted(str(key) for key in data if key in _GPU_ONLY)
    node_fields = sorted(str(key) for key in data if key in _NODE_ONLY)
    if gpu_fields and node_fields:
        raise ConfigError(
            f"{path}: has fields of a GPU ({', '.join(gpu_fields)}) and of a node ({', '.join(node_fields)}); "
            f"a GPU's file has only the GPU's fields, and a node's gives its GPU in field 'gpu' "
            f"(a preset name, a YAML path or a mapping)"
        )
    if not gpu_fields and not node_fields:
        unknown = sorted(str(key) for key in data if key not in GpuConfig.model_fields)
        needs = ", ".join(f for f in _GPU_ONLY if GpuConfig.model_fields[f].is_required())
        raise ConfigError(
            f"{path}: neither a GPU's description (which needs fields {needs}) nor a node's (which needs "
            f"field 'gpu')" + (f"; unknown fields: {', '.join(unknown)}" if unknown else "")
        )
    return bool(gpu_fields)


class _Description:
    """A description merged over its chain of bases, with the files that wrote it (own file first).

    Parameters
    ----------
    data
        The merged fields, ``base`` removed.
    layers
        ``(file, fields as written in that file)`` from the description itself to its last base.
    own_file
        Whether the description is a file's top level (a GPU written inline in a node's file is not).
    """

    def __init__(self, data: dict[str, Any], layers: list[tuple[Path, dict[str, Any]]], own_file: bool = True):
        self.data = data
        self.layers = layers
        self.own_file = own_file

    def origin(self, keys: list[str]) -> Path:
        """The file whose value of the dotted field ``keys`` takes effect (the description's own if none)."""
        for path, fields in self.layers:
            node: Any = fields
            for key in keys:
                if not isinstance(node, dict) or key not in node:
                    break
                node = node[key]
            else:
                return path
        return self.layers[0][0]


def _merged(base: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """``own`` merged into ``base``: mappings merge, other values replace, ``sources`` accumulate."""
    merged = copy.deepcopy(base)
    for key, value in own.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merged(merged[key], value)
        elif key == "sources" and isinstance(value, list) and isinstance(merged.get(key), list):
            merged[key] = copy.deepcopy(value) + merged[key]
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _referenced_file(ref: str, origin: Path, field: str, presets: dict[str, Path], what: str) -> Path:
    """The file that ``field`` of the description in ``origin`` names: a YAML path relative to
    ``origin``, or one of ``presets`` (``what`` they are, for the message)."""
    candidate = origin.parent / ref
    if candidate.suffix in (".yaml", ".yml"):
        if not candidate.is_file():
            raise ConfigError(f"{origin}: field '{field}': no such file {candidate}")
        return candidate
    if ref not in presets:
        raise ConfigError(f"{origin}: field '{field}': unknown {what} {ref!r}; known: {', '.join(sorted(presets))}")
    return presets[ref]


def _check_same_kind(own: dict[str, Any], inline: bool, base: _Description, ref: str, origin: Path) -> None:
    """Raise when a description and its ``base`` (named ``ref`` in ``origin``) are not of one kind: a
    GPU's fields (``num_cus``) on a node's base, a node's (``num_gpus``) on a GPU's, or a GPU
    written inline in a node that starts from a node.

    Raises
    ------
    ConfigError
        Naming the file, the field ``base`` and the kind of description it expects.
    """
    base_kind = "node" if "gpu" in base.data else "GPU"
    node_fields = sorted(str(key) for key in own if key == "gpu" or key in _NODE_ONLY)
    gpu_fields = sorted(str(key) for key in own if key in _GPU_ONLY)
    own_kind, fields = ("GPU", gpu_fields) if inline or not node_fields else ("node", node_fields)
    if base_kind == own_kind or not (inline or fields):
        return
    field = "gpu.base" if inline else "base"
    given = "a node's 'gpu' is a GPU's" if inline else f"this file gives a {own_kind}'s fields ({', '.join(fields)})"
    if own_kind == "GPU":
        advice = f"start from a GPU preset ({', '.join(sorted(_preset_files('gpus')))}) or a GPU's file"
        if not inline:
            advice += ", or give the node's GPU these fields under 'gpu'"
    else:
        advice = f"start from a node preset, or name the GPU in field 'gpu' (gpu: {ref})"
    raise ConfigError(f"{origin}: field '{field}': {ref!r} is a {base_kind}'s description, but {given}; {advice}")


def _unit_alias(name: str, fields: Mapping[str, Any]) -> tuple[str, str] | None:
    """The field of ``fields`` that ``name`` is with its unit suffix dropped (``bandwidth`` for
    ``bandwidth_bytes_per_s``) and the kind of quantity it holds, or ``None``."""
    return next(((name + suffix, kind) for suffix, kind in UNIT_SUFFIXES.items() if name + suffix in fields), None)


def _unit_aliases_resolved(fields: dict[str, Any], known: Mapping[str, FieldInfo], origin: Path,
                           keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """``fields`` (a description's, or a section's at the dotted path ``keys``) with each key that
    drops a known field's unit suffix (``bandwidth`` for ``bandwidth_bytes_per_s``) renamed to that
    field, as overrides allow; sections and lists of sections are resolved in turn.

    Raises
    ------
    ConfigError
        Naming ``origin`` and the field: such a key whose value does not say its unit, or a field
        given both with and without its suffix.
    """
    resolved: dict[str, Any] = {}
    for key, value in fields.items():
        alias = _unit_alias(key, known) if isinstance(key, str) and key not in known else None
        name = key if alias is None else alias[0]
        if alias is not None:
            where = ".".join((*keys, key))
            if name in fields:
                raise ConfigError(f"{origin}: field '{where}': gives the field {name!r} that "
                                  f"'{'.'.join((*keys, name))}' gives too; give it once")
            try:
                parse_quantity(value, alias[1], require_unit=True)
            except QuantityError as exc:
                raise ConfigError(f"{origin}: field '{where}' (for {name!r}): {exc}") from exc
        info = known.get(name)
        annotation = info.annotation if info is not None else None
        if typing.get_origin(annotation) in (list, tuple) and isinstance(value, list):
            item_model = _model_of(typing.get_args(annotation)[0])
            if item_model is not None:
                value = [_unit_aliases_resolved(item, item_model.model_fields, origin, (*keys, name, str(index)))
                         if isinstance(item, dict) else item for index, item in enumerate(value)]
        elif isinstance(value, dict) and (model := _model_of(annotation)) is not None:
            value = _unit_aliases_resolved(value, model.model_fields, origin, (*keys, name))
        resolved[name] = value
    return resolved


_DESCRIPTION_FIELDS = {**GpuConfig.model_fields, **SystemConfig.model_fields}
"""The fields a file's top level may give: a GPU's or a node's (whose ``gpu`` is a GPU's)."""


def _description(fields: dict[str, Any], origin: Path, seen: tuple[Path, ...] = (), inline: bool = False) -> _Description:
    """Resolve the ``base`` chain of a description read from ``origin`` (or written ``inline`` in it)."""
    fields = _unit_aliases_resolved(fields, GpuConfig.model_fields if inline else _DESCRIPTION_FIELDS, origin)
    if "base" not in fields:
        return _Description(copy.deepcopy(fields), [(origin, fields)], not inline)
    own = {key: value for key, value in fields.items() if key != "base"}
    ref = fields["base"]
    if not isinstance(ref, str) or not ref:
        raise ConfigError(f"{origin}: field 'base': expected a preset name or a YAML path, got {ref!r}")
    base_path = _referenced_file(ref, origin, "base", {**_preset_files("gpus"), **_preset_files("nodes")}, "preset")
    chain = (*seen, origin)
    if base_path.resolve() in {path.resolve() for path in chain}:
        cycle = " -> ".join(str(path) for path in (*chain, base_path))
        raise ConfigError(f"{origin}: field 'base': the chain of bases loops ({cycle})")
    base = _description(_read_yaml(base_path), base_path, chain)
    _check_same_kind(own, inline, base, ref, origin)
    base_gpu = base.data.get("gpu")
    if isinstance(own.get("gpu"), dict) and "base" not in own["gpu"] and isinstance(base_gpu, str):
        # changes to the base's GPU preset: start from that preset (a path is relative to the file naming it)
        gpu_file = _referenced_file(base_gpu, base.origin(["gpu"]), "gpu", _preset_files("gpus"), "GPU preset")
        own["gpu"] = {"base": str(gpu_file), **own["gpu"]}
    if "name" not in own:  # a derived description is not its base
        own["name"] = f"{origin.stem}.gpu" if inline else origin.stem
    if "description" not in own:
        own["description"] = f"{fields['base']}, changed ({base.data.get('description', '')})"
    return _Description(_merged(base.data, own), [(origin, fields), *base.layers], not inline)


def _gpu_description(ref: Any, origin: Path) -> _Description:
    if isinstance(ref, dict):
        return _description(ref, origin, inline=True)
    if ref is None:
        raise ConfigError(f"{origin}: field 'gpu': none given; a node's description names its GPU: a GPU preset "
                          f"(such as 'a100-sxm4'), a YAML path, or the GPU's fields as a mapping")
    if not isinstance(ref, str):
        raise ConfigError(f"{origin}: field 'gpu': expected a GPU preset name or a mapping, got {ref!r}")
    path = _referenced_file(ref, origin, "gpu", _preset_files("gpus"), "GPU preset")
    gpu = _description(_read_yaml(path), path)
    if "gpu" in gpu.data:  # itself, or its base, names a GPU
        raise ConfigError(f"{origin}: field 'gpu': {path} is a node's description (it has a 'gpu' of its own); "
                          f"a node's 'gpu' is a GPU preset, a GPU's file or the GPU's fields")
    return gpu


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as ``LinkConfig | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        for arg in typing.get_args(annotation):
            model = _model_of(arg)
            if model is not None:
                return model
    return None


def _is_mapping(annotation: Any) -> bool:
    return typing.get_origin(annotation) is dict


def _list_from_text(path: str, name: str, text: str) -> list[Any]:
    """The value of the list field ``name`` that the override ``path`` gives as text, written as YAML
    writes a list (``[[0, 1], [1, 2, 2]]``, ``[0.1, 0.5]``).

    Raises
    ------
    ConfigError
        The text is not such a list.
    """
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = None
    if not isinstance(value, list):
        raise ConfigError(f"override {path!r}: field {name!r} takes a list, written as YAML writes one "
                          f"(such as [0.1, 0.5] or [[0, 1], [1, 2]]), got {text!r}")
    return value


def _resolve_path(path: str, value: Any) -> tuple[list[str], list[FieldInfo | None], Any]:
    """Map an override path onto field names; check values given to unit-less aliases.

    Returns the field names, the field each names (``None`` for a key of a mapping such as a dtype
    table) and the value to write.
    """
    if not isinstance(path, str):
        raise ConfigError(f"override {path!r}: paths must be dotted strings such as 'gpu.num_cus'")
    model: type[BaseModel] | None = SystemConfig
    keys: list[str] = []
    infos: list[FieldInfo | None] = []
    parts = path.split(".")
    for index, part in enumerate(parts):
        if model is None:
            keys.append(part)  # inside a free-form mapping (e.g. a dtype table)
            infos.append(None)
            continue
        fields = model.model_fields
        if part in fields:
            name = part
        else:
            alias = _unit_alias(part, fields)
            if alias is None:
                where = ".".join(parts[:index]) or "the system"
                likely = _likely_field(part, fields)
                meant = f" (did you mean {likely!r}?)" if likely else ""
                raise ConfigError(
                    f"override {path!r}: {where} has no field {part!r}{meant}; known fields: {', '.join(sorted(fields))}"
                )
            name, kind = alias
            if index == len(parts) - 1:
                try:
                    parse_quantity(value, kind, require_unit=True)
                except QuantityError as exc:
                    raise ConfigError(f"override {path!r} (field {name!r}): {exc}") from exc
        keys.append(name)
        infos.append(fields[name])
        annotation = fields[name].annotation
        if annotation is str and index == len(parts) - 1 and isinstance(value, bool | int | float):
            # a text field given what a command line read as a number or a boolean (``name=123``,
            # ``description=true``); text as typed (``007``) is kept as it is
            value = str(value).lower() if isinstance(value, bool) else str(value)
        if typing.get_origin(annotation) in (list, tuple) and index == len(parts) - 1 and isinstance(value, str):
            value = _list_from_text(path, name, value)  # a list as a command line gives it
        model = _model_of(annotation)
        if model is None and index < len(parts) - 1 and not _is_mapping(annotation):
            raise ConfigError(f"override {path!r}: field {name!r} has no sub-fields")
    return keys, infos, value


def _section(info: FieldInfo | None) -> tuple[dict[str, Any], bool]:
    """What an override writes into where the description leaves out a section (``info``'s field),
    and whether that creates an optional section (one that is ``None`` by default)."""
    default = None if info is None or info.is_required() else info.get_default(call_default_factory=True)
    if isinstance(default, BaseModel):
        return default.model_dump(), False
    if isinstance(default, dict):
        return copy.deepcopy(default), False
    return {}, info is not None and not info.is_required()


def _apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Write overrides into ``data`` in place.

    Returns
    -------
    resolved
        Resolved dotted path -> the user's path.
    created
        Dotted path of each optional section that the description left empty and overrides
        created -> the user's paths of those overrides.
    """
    resolved: dict[str, str] = {}
    created: dict[str, list[str]] = {}
    for path, value in overrides.items():
        keys, infos, value = _resolve_path(path, value)
        field = ".".join(keys)
        if field in resolved:  # a field and its unit-less alias (links.bandwidth, links.bandwidth_bytes_per_s)
            raise ConfigError(f"override {path!r}: field {field!r} is set by override {resolved[field]!r} too; "
                              f"give it once")
        node = data
        for depth, key in enumerate(keys[:-1]):
            child = node.get(key)
            section = ".".join(keys[: depth + 1])
            if child is None:
                child, new = _section(infos[depth])
                node[key] = child
                if new:
                    created[section] = []
            if not isinstance(child, dict):
                raise ConfigError(f"override {path!r}: {key!r} is not a mapping in the preset")
            if section in created:
                created[section].append(path)
            node = child
        node[keys[-1]] = value
        resolved[field] = path
    return resolved, created


def _likely_field(name: str, fields: typing.Iterable[str]) -> str | None:
    """The field that the unknown ``name`` was most likely meant to be, matched with and without
    unit suffixes (``bandwith`` -> ``bandwidth_bytes_per_s``), or ``None``."""
    spellings = {field: field for field in fields}
    for field in list(spellings):
        for suffix in UNIT_SUFFIXES:
            if field.endswith(suffix):
                spellings.setdefault(field.removesuffix(suffix), field)
                break
    likely = difflib.get_close_matches(name, spellings, n=1)
    return spellings[likely[0]] if likely else None


def _section_fields(parts: list[str]) -> list[str]:
    """The fields of the section at ``parts`` of a system's description (``["gpu", "l2"]``); none
    where ``parts`` is not a section."""
    model: type[BaseModel] | None = SystemConfig
    for part in parts:
        if part.isdigit():  # an item of a list of sections (collectives.protocols.0)
            continue
        info = model.model_fields.get(part)
        if info is None:
            return []
        annotation = info.annotation
        if typing.get_origin(annotation) in (list, tuple):
            annotation = typing.get_args(annotation)[0]
        model = _model_of(annotation)
        if model is None:
            return []
    return list(model.model_fields)


def _unknown_field(parts: list[str], listed: set[str]) -> str:
    """What to say of the unknown field at ``parts``: the known field it was likely meant to be,
    else the fields its section has, unless an earlier message listed them (its section is in
    ``listed``, to which it is added)."""
    known = _section_fields(parts[:-1])
    likely = _likely_field(parts[-1], known)
    if likely:
        return f"unknown field (did you mean '{likely}'?)"
    section = ".".join(parts[:-1])
    if not known or section in listed:
        return "unknown field"
    listed.add(section)
    return f"unknown field; known fields: {', '.join(sorted(known))}"


def _format_validation(exc: ValidationError, system: _Description, gpu: _Description,
                       overridden: dict[str, str], created: dict[str, list[str]]) -> str:
    lines = []
    listed: set[str] = set()  # sections whose known fields a line lists
    for err in exc.errors():
        parts = [str(p) for p in err["loc"]]
        bad_key = parts[-1:] == ["[key]"]  # a table's key (a dtype, an NMC operation) that is not known
        if bad_key:
            parts = parts[:-1]
        loc = ".".join(parts)
        origin = next((f"override {overridden[p]!r}" for p in overridden if loc == p or loc.startswith(p + ".")), None)
        field = loc or "(the description as a whole)"
        section = next((c for c in created if loc == c or loc.startswith(c + ".")), None)
        written_in_a_file = origin is None and section is None
        note = ""
        if origin is None and section is not None:  # in a section that overrides created
            paths = created[section]
            origin = f"override{'s' if len(paths) > 1 else ''} {', '.join(repr(path) for path in paths)}"
            creates = "the override creates" if len(paths) == 1 else "the overrides create"
            needs = f"; a new '{section}' needs this field too" if err["type"] == "missing" else ""
            note = f" (the description leaves '{section}' empty, so {creates} it{needs})"
        elif origin is None:
            if parts[:1] == ["gpu"] and len(parts) > 1:
                origin = str(gpu.origin(parts[1:]))
                field = ".".join(parts[1:]) if gpu.own_file else loc
            else:
                origin = str(system.origin(parts))
            inside = [overridden[p] for p in overridden if not loc or p.startswith(loc + ".")]
            if inside:  # a check of a whole section failed on a value an override put into it
                origin += f" with override {', '.join(repr(path) for path in inside)}"
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = _unknown_field(parts, listed)
        shown = err["type"] not in ("missing", "extra_forbidden") and not isinstance(err["input"], dict) and not bad_key
        quoted = isinstance(err["input"], str) and repr(err["input"]) in message  # a unit error quotes the value
        got = f" (got {err['input']!r})" if shown and not quoted and not message.endswith(repr(err['input'])) else ""
        if written_in_a_file and err["type"] == "string_type" and isinstance(err["input"], bool | int | float):
            note += "; YAML reads it as a number or a boolean: quote the text"  # name: 1234, description: yes
        lines.append(f"{origin}: field '{field}': {message}{got}{note}")
    return "\n".join(dict.fromkeys(lines))  # a GPU's file names the system too: its errors would come twice


def load_system_config(name_or_path: str | os.PathLike, overrides: Mapping[str, Any] | None = None) -> SystemConfig:
    """Load a node or GPU preset (or a YAML file) into a validated :class:`SystemConfig`.

    Parameters
    ----------
    name_or_path
        A preset name (``"t3-ring8"``, ``"mi210"``) or a path to a YAML file.  A GPU on its own
        becomes a one-GPU system.
    overrides
        Dotted paths to replace, e.g. ``{"gpu.num_cus": 160, "links.bandwidth": "300 GB/s"}``.  An
        override into an optional section that the description leaves empty (``network``,
        ``gpu.gemm_tma``...) creates that section, its other fields at their defaults (see the
        module's description).

    Raises
    ------
    UnknownPresetError
        For a name that is neither a preset nor a file; the message lists the known presets.
    ConfigError
        For invalid contents; the message names the file or override, the field and what was expected.
    """
    ref = os.fspath(name_or_path)
    path = Path(ref)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        if path.is_dir():
            raise ConfigError(f"{path}: is a folder; expected a YAML file")
        if not path.is_file():
            raise ConfigError(f"{path}: no such file")
        source = path
    else:
        presets = {**_preset_files("gpus"), **_preset_files("nodes")}
        if ref not in presets and ref and path.is_dir():  # Path("") is the current folder
            raise ConfigError(f"{path}: is a folder; expected a preset name or a YAML file")
        if ref not in presets:
            raise UnknownPresetError(ref, list(presets))
        source = presets[ref]
    system = _description(_read_yaml(source), source)
    if _is_gpu_description(system.data, source):
        gpu = system
        data: dict[str, Any] = {"name": system.data.get("name", path.stem), "num_gpus": 1}
    else:
        gpu = _gpu_description(system.data.get("gpu"), system.origin(["gpu"]))
        data = {key: value for key, value in system.data.items() if key != "gpu"}
    data = copy.deepcopy(data)
    data["gpu"] = copy.deepcopy(gpu.data)
    if overrides is not None and not isinstance(overrides, Mapping):
        raise ConfigError(f"overrides must be a mapping of dotted paths to values, got {type(overrides).__name__}")
    overridden, created = _apply_overrides(data, overrides or {})
    try:
        config = SystemConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation(exc, system, gpu, overridden, created)) from None
    for field, path in overridden.items():
        unused = _unused_by(config, field)
        if unused:
            warnings.warn(f"override {path!r}: {config.name} does not use {field}: {unused}; the value changes "
                          "nothing", NoEffectWarning, stacklevel=2)
    return config


LINK_SPEED_FIELDS = ("links.bandwidth_bytes_per_s", "links.latency_ns")
"""The link fields a switch topology does not use (its GPUs reach each other through the switch's
ports); its routes still take the links' ``packet_bytes`` and ``credit_bytes``."""


def _unused_by(config: SystemConfig, field: str) -> str | None:
    """Why ``config`` does not use the (resolved, dotted) ``field``, or ``None`` when it does."""
    section = field.split(".", 1)[0]
    if section in ("links", "switch", "topology") and config.total_gpus == 1:
        return "it has one GPU"
    if section == "topology" and config.num_gpus == 1:
        return "its nodes have one GPU each"
    if section == "switch" and (config.topology.kind != "switch" or config.num_gpus == 1):
        return f"its topology is {config.topology.kind} of {config.num_gpus} GPU(s), without a switch"
    if field in LINK_SPEED_FIELDS and (config.topology.kind == "switch" or config.num_gpus == 1):
        return ("its GPUs reach each other through the switch's ports (switch.*)" if config.num_gpus > 1
                else "its nodes have one GPU each")
    if section == "network" and config.nodes == 1:
        return "it is one node"
    return None


def override_field(config: SystemConfig, path: str, value: Any) -> tuple[str, Any]:
    """The field an override ``path`` set to ``value`` names, and its value in ``config``.

    Parameters
    ----------
    config
        A description the override was applied to (:func:`load_system_config`).
    path
        The override's dotted path as the user wrote it (``links.bandwidth``).
    value
        The value it was given (a unit-less alias checks that it has a unit).

    Returns
    -------
    tuple
        The field's dotted path (``links.bandwidth_bytes_per_s``) and its value in ``config``, in
        the field's base unit (``3e11``; a section comes back as plain data).

    Raises
    ------
    ConfigError
        ``path`` names no field.
    """
    keys, _, _ = _resolve_path(path, value)
    node: Any = config
    for key in keys:
        node = node[key] if isinstance(node, Mapping) else getattr(node, key)
    if isinstance(node, BaseModel):
        node = node.model_dump(mode="json")
    return ".".join(keys), node


def overridden_field(path: str, value: Any) -> str:
    """The dotted field path (``links.bandwidth_bytes_per_s``) that an override ``path``
    (``links.bandwidth``) given ``value`` sets.

    Raises
    ------
    ConfigError
        ``path`` names no field, or a path without its field's unit suffix is given a value
        without a unit.
    """
    keys, _, _ = _resolve_path(path, value)
    return ".".join(keys)


def load_gpu_config(name_or_path: str | os.PathLike) -> GpuConfig:
    """Load just a GPU description (a GPU preset, or the GPU of a node preset)."""
    return load_system_config(name_or_path).gpu
