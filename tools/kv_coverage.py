"""Which KV caches each text-generation architecture of a vLLM tree builds, and
which of them declare their TP replication (docs/kv-replication-coverage.md).

Reads the tree's source only (no import of vLLM): every architecture of the
model registry's text-generation and speculative-decoding tables, the layer
classes its model class reaches (base classes, classes it constructs or
names, helpers it calls, across modules), and the KV cache layers among them
(subclasses of AttentionLayerBase). A cache layer declares replication when:

- it is `Attention` (or a subclass) built with `kv_proj=`: GQA attention that
  takes its claim from the projection's quant method
  (QKVParallelLinear.kv_max_tp_shards);
- it is another cache layer whose class (or a base) sets `max_tp_shards` on
  the spec it builds, or `tp_replicated=True` / is_kv_cache_tp_replicated:
  caches written from TP-replicated projections (MLA, indexers, DeepSeek-V4).

    python tools/kv_coverage.py build/vllm-0.33.0            # print the page
    python tools/kv_coverage.py build/vllm-0.33.0 --write F  # write it to F
    python tools/kv_coverage.py build/vllm-0.33.0 --check F  # exit 1 if F differs
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

BASE_CLASS = ("vllm.model_executor.layers.attention_layer_base", "AttentionLayerBase")
ATTENTION = ("vllm.model_executor.layers.attention.attention", "Attention")
REGISTRY = "vllm.model_executor.models.registry"
TABLES = ("_TEXT_GENERATION_MODELS", "_SPECULATIVE_DECODING_MODELS")

# Why a reviewed cache layer (by the class that builds it) does not declare
# (the same reasons stand in the model code, where the declaration would go).
# Every other undeclared layer reads "not reviewed".
REASONS: dict[str, str] = {
    "commandr.CohereAttention": (
        "with `use_qk_norm`, `k_norm` rows are loaded at `tp_rank`, not at the"
        " KV head the rank holds: ranks sharing a head normalize it differently"
    ),
    "internlm2.InternLM2Attention": (
        "`wqkv` is loaded fused and split by rank after an all-gather, not by KV head"
    ),
    "olmoe.OlmoeAttention": (
        "full-width `k_norm` over K all-gathered across TP; nothing replicated"
        " at TP <= KV heads"
    ),
    "minimax_m2.MiniMaxM2Attention": (
        "TP-sharded full-width `k_norm` with an all-reduced variance: identical"
        " only if every all-reduce backend is bitwise reproducible (not proven"
        " for ROCm's fused path)"
    ),
    "llama4.Llama4Attention": (
        "`ChunkedLocalAttention` builds its own spec and takes no projection"
    ),
    "models.minimax_m3.nvidia.model.MiniMaxM3DecoderLayer": (
        "sparse layers build their own spec from a fused QKV + indexer projection"
    ),
    "models.minimax_m3.amd.model.MiniMaxM3DecoderLayer": (
        "sparse layers build their own spec from a fused QKV + indexer projection"
    ),
}
# Cache layers whose state TP shards by head (MambaBase without
# is_kv_cache_tp_replicated): never replicated, nothing to declare.
SHARDED_STATE = "state sharded by head across TP ranks: each rank holds its own"
MAMBA_BASE = ("vllm.model_executor.layers.mamba.abstract", "MambaBase")

Ref = tuple[str, str]  # (module, name)


@dataclass
class Module:
    name: str
    tree: ast.Module
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)
    imports: dict[str, Ref] = field(default_factory=dict)  # local name -> ref
    # Module-level names bound to an expression (aliases, tables of layer
    # classes), in every branch of top-level if/try blocks.
    variables: dict[str, ast.expr] = field(default_factory=dict)


def _top_level(body: list[ast.stmt]):
    """Statements at module level, including those in if/try blocks."""
    for node in body:
        if isinstance(node, ast.If):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _top_level(block)
            for handler in node.handlers:
                yield from _top_level(handler.body)
        else:
            yield node


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def load(root: Path) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for path in sorted((root / "vllm").rglob("*.py")):
        name = module_name(root, path)
        tree = ast.parse(path.read_text(), str(path))
        mod = Module(name, tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = node.module or ""
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    source = ".".join(base + ([source] if source else []))
                for alias in node.names:
                    mod.imports[alias.asname or alias.name] = (source, alias.name)
        for node in _top_level(tree.body):
            if isinstance(node, ast.ClassDef):
                mod.classes.setdefault(node.name, node)
            elif isinstance(node, ast.FunctionDef):
                mod.functions.setdefault(node.name, node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value:
                targets = (
                    node.targets if isinstance(node, ast.Assign) else [node.target]
                )
                for target in targets:
                    if isinstance(target, ast.Name):
                        mod.variables[target.id] = node.value
        modules[name] = mod
    return modules


class Index:
    def __init__(self, root: Path):
        self.modules = load(root)
        self._cache_layer: dict[Ref, bool] = {}
        self._resolved: dict[tuple[str, str], Ref | None] = {}
        self._direct: dict[Ref, tuple[set[Cache], list[Ref]]] = {}

    def resolve(self, module: str, name: str, depth: int = 0) -> Ref | None:
        """Where `name`, as module `module` sees it, is defined."""
        key = (module, name)
        if key not in self._resolved:
            self._resolved[key] = self._resolve(module, name, depth)
        return self._resolved[key]

    def _resolve(self, module: str, name: str, depth: int) -> Ref | None:
        mod = self.modules.get(module)
        if mod is None or depth > 8:
            return None
        if name in mod.classes or name in mod.functions or name in mod.variables:
            return (module, name)
        if name in mod.imports:
            source, original = mod.imports[name]
            if f"{source}.{original}" in self.modules:
                return None  # a module, not a class
            return self.resolve(source, original, depth + 1)
        return None

    def class_def(self, ref: Ref) -> ast.ClassDef | None:
        mod = self.modules.get(ref[0])
        return mod.classes.get(ref[1]) if mod else None

    def bases(self, ref: Ref) -> list[Ref]:
        mod = self.modules.get(ref[0])
        if mod is not None and ref[1] in mod.variables:
            # An alias (`Base = LlamaForCausalLM`): what it names.
            out = []
            for sub in ast.walk(mod.variables[ref[1]]):
                if isinstance(sub, ast.Name) and (
                    target := self.resolve(ref[0], sub.id)
                ):
                    out.append(target)
            return out
        node = self.class_def(ref)
        if node is None:
            return []
        out = []
        for base in node.bases:
            name = base.id if isinstance(base, ast.Name) else None
            if isinstance(base, ast.Attribute):
                name = base.attr
            if name and (resolved := self.resolve(ref[0], name)):
                out.append(resolved)
        return out

    def ancestry(self, ref: Ref) -> list[Ref]:
        seen, todo = [], [ref]
        while todo:
            cur = todo.pop()
            if cur not in seen:
                seen.append(cur)
                todo.extend(self.bases(cur))
        return seen

    def is_cache_layer(self, ref: Ref) -> bool:
        if ref not in self._cache_layer:
            self._cache_layer[ref] = BASE_CLASS in self.ancestry(ref)[1:]
        return self._cache_layer[ref]

    def declares_itself(self, ref: Ref) -> bool:
        """A cache layer whose class or bases build their spec with a constant
        max_tp_shards, or declare TP-replicated Mamba state."""
        for cls in self.ancestry(ref):
            node = self.class_def(cls)
            if node is None:
                continue
            for sub in ast.walk(node):
                if isinstance(sub, ast.keyword) and isinstance(sub.value, ast.Constant):
                    value = sub.value.value
                    if sub.arg == "max_tp_shards" and isinstance(value, int):
                        return True
                    if sub.arg == "tp_replicated" and value is True:
                        return True
                if (
                    isinstance(sub, ast.FunctionDef)
                    and sub.name == "is_kv_cache_tp_replicated"
                    and any(
                        isinstance(r, ast.Return)
                        and isinstance(r.value, ast.Constant)
                        and r.value.value is True
                        for r in ast.walk(sub)
                    )
                ):
                    return True
        return False


@dataclass(frozen=True)
class Cache:
    layer: str  # the cache layer class
    site: str  # module.Class (or module.function) that builds it
    declared: bool
    sharded_state: bool = False  # head-sharded Mamba-style state


def site_name(ref: Ref) -> str:
    """`module.Class` of a class or function, relative to the model packages."""
    module = ref[0].removeprefix("vllm.model_executor.models.").removeprefix("vllm.")
    return f"{module}.{ref[1]}"


def _called_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def caches_of(index: Index, arch: Ref) -> set[Cache]:
    """The KV cache layers that `arch`'s model class reaches; for a model of
    its own package (vllm.models.<name>), whose layers are often picked per
    platform or through factories, every cache layer its package builds."""
    found = reachable_caches(index, arch)
    if arch[0].startswith("vllm.models."):
        package = ".".join(arch[0].split(".")[:3])
        for name, mod in index.modules.items():
            if name == package or name.startswith(package + "."):
                for ref in [*mod.classes, *mod.functions]:
                    found |= direct(index, (name, ref))[0]
    return found


def reachable_caches(index: Index, arch: Ref) -> set[Cache]:
    found: set[Cache] = set()
    seen: set[Ref] = set()
    todo: list[Ref] = [arch]
    while todo:
        ref = todo.pop()
        if ref in seen:
            continue
        seen.add(ref)
        caches, reached = direct(index, ref)
        found |= caches
        todo.extend(r for r in reached if r not in seen)
    return found


def direct(index: Index, ref: Ref) -> tuple[set[Cache], list[Ref]]:
    """The cache layers that class or function `ref` builds itself, and the
    classes and functions it reaches (bases, what it builds or names)."""
    if ref in index._direct:
        return index._direct[ref]
    caches: set[Cache] = set()
    reached: list[Ref] = []
    mod = index.modules[ref[0]]
    node = (
        mod.classes.get(ref[1])
        or mod.functions.get(ref[1])
        or mod.variables.get(ref[1])
    )
    if node is not None:
        if isinstance(node, ast.ClassDef):
            reached.extend(index.bases(ref))
        site = site_name(ref)
        for sub in ast.walk(node):
            name = None
            if isinstance(sub, ast.Name):
                name = sub.id
            elif isinstance(sub, ast.Call):
                name = _called_name(sub.func)
            if not name or not (target := index.resolve(ref[0], name)):
                continue
            if index.is_cache_layer(target):
                if isinstance(sub, ast.Call):
                    caches.add(cache(index, target, site, sub))
                elif target != ref:
                    # Named, not built here (e.g. `attn_cls = Attention`):
                    # built through that name, the kwargs are at the call.
                    caches.update(indirect_builds(index, ref, node, name, target))
            else:
                reached.append(target)
    index._direct[ref] = (caches, reached)
    return caches, reached


def cache(index: Index, layer: Ref, site: str, call: ast.Call) -> Cache:
    ancestry = index.ancestry(layer)
    if ATTENTION in ancestry:
        declared = any(k.arg == "kv_proj" for k in call.keywords)
    else:
        declared = index.declares_itself(layer)
    return Cache(layer[1], site, declared, MAMBA_BASE in ancestry and not declared)


def indirect_builds(index, ref, node, name, target) -> set[Cache]:
    """A cache layer class bound to a variable, then called through it."""
    site = site_name(ref)
    bound = {
        t.id
        for sub in ast.walk(node)
        if isinstance(sub, ast.Assign)
        for t in sub.targets
        if isinstance(t, ast.Name)
        and any(isinstance(v, ast.Name) and v.id == name for v in ast.walk(sub.value))
    }
    out = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and _called_name(sub.func) in bound:
            out.add(cache(index, target, site, sub))
    return out


def registry(index: Index) -> dict[str, Ref]:
    archs: dict[str, Ref] = {}
    tree = index.modules[REGISTRY].tree
    for node in tree.body:
        if not (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in TABLES
        ):
            continue
        table = ast.literal_eval(node.value)
        for arch, (module, cls) in table.items():
            if not module.startswith("vllm."):
                module = f"vllm.model_executor.models.{module}"
            archs[arch] = (module, cls)
    return archs


PROVEN = (
    "bf16/fp16; FP8 checkpoints per tensor, or in blocks aligned to the rank's"
    " heads; `fp8_per_tensor`, `fp8_per_channel`; `fp8_per_block` when a rank's"
    " Q rows fill whole 128-row blocks"
)


def page(root: Path, index: Index | None = None) -> str:
    index = index or Index(root)
    rows = []
    counts = {"all": 0, "some": 0, "none": 0, "no cache": 0}
    for arch, ref in sorted(registry(index).items()):
        caches = sorted(
            (c for c in caches_of(index, ref) if c.layer != "EncoderOnlyAttention"),
            key=lambda c: (c.layer, c.site),
        )
        layers = sorted({c.layer for c in caches})
        if not caches:
            status = "no cache"
        elif all(c.declared for c in caches):
            status = "all"
        elif any(c.declared for c in caches):
            status = "some"
        else:
            status = "none"
        counts[status] += 1
        declared = sorted({c.site for c in caches if c.declared})
        reasons = {}
        for c in caches:
            if not c.declared:
                reason = SHARDED_STATE if c.sharded_state else "not reviewed"
                reasons.setdefault(c.site, REASONS.get(c.site, reason))
        why = "; ".join(f"`{site}`: {reasons[site]}" for site in sorted(reasons))
        rows.append(
            f"| `{arch}` | {', '.join(f'`{x}`' for x in layers) or '-'} | {status}"
            f" | {', '.join(f'`{s}`' for s in declared) or '-'} | {why or '-'} |"
        )
    header = f"""# KV cache TP replication: coverage by architecture

Generated by `tools/kv_coverage.py` from `{root.name}` (the release with this
project's series): do not edit by hand; `tests/test_kv_coverage.py` fails when
this page and the code disagree.

For every architecture of vLLM's text-generation and speculative-decoding
registries: the KV cache layers its model's code can build (on any platform
or config branch, so some models list layers that only other configs use),
whether they declare which TP ranks hold identical KV
(`AttentionSpec.max_tp_shards`, or TP-replicated Mamba state), and where they
are built. Only declared caches can be stored once per
group of identical ranks by the KV offloading connector; an undeclared cache
costs that deduplication, never correctness.

- GQA attention declares through its projection (`Attention(kv_proj=...)`), for
  the weight quantization methods proven to keep ranks that share a KV head
  identical: {PROVEN}. Any other method claims nothing at run time.
- Caches written from TP-replicated projections (MLA latents, indexers,
  DeepSeek-V4) declare in their own spec, for every quantization method (every
  rank quantizes the same full weight).
- Status: `all` every cache the model builds declares; `some` part of them
  (the model's `kv_tp_replicas` is then 1 unless the others are replicated
  too); `none`; `no cache` (encoder-only, or nothing found).

Architectures: {sum(counts.values())}; all declared: {counts["all"]}, some: \
{counts["some"]}, none: {counts["none"]}, no KV cache found: {counts["no cache"]}.

| Architecture | KV cache layers | Declares | Declared at | Not declared at, and why |
| --- | --- | --- | --- | --- |
"""
    return header + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", type=Path)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", type=Path)
    group.add_argument("--check", type=Path)
    args = parser.parse_args(argv)
    text = page(args.tree.resolve())
    if args.write:
        args.write.write_text(text)
    elif args.check:
        if not args.check.exists() or args.check.read_text() != text:
            print(
                f"{args.check} is not what tools/kv_coverage.py makes of "
                f"{args.tree}: run `python tools/kv_coverage.py {args.tree} "
                f"--write {args.check}` and review the difference",
                file=sys.stderr,
            )
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
