"""Re-derive tpuserve/data/provider-facts.json from the providers' own source: which input paths of each resource the
stacks declare force a replacement, and which Compute Instance updates need a stopped VM.

    .venv/bin/python scripts/provider_facts.py --fetch ~/src        # get each pinned source (git, network), then
    .venv/bin/python scripts/provider_facts.py --sources ~/src       # rewrite the JSON (--check: exit 1 if it differs)

Each source is a git clone (or bare git dir) holding the pinned commit of PINS, in <sources>/<repository name>, or
named by --<key>. How the Go source is read, and why: docs/design/provider-facts.md.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tpuserve" / "data" / "provider-facts.json"


@dataclass(frozen=True)
class Pin:
    repo: str  # owner/name on GitHub
    rev: str  # commit (or tag) read
    tag: str  # the release it is
    note: str = ""

    @property
    def dirname(self) -> str:
        return self.repo.rsplit("/", 1)[1]

    def fetch_commands(self, sources: Path) -> list[list[str]]:
        """A shallow clone of just the pinned commit (GitHub serves a commit by its id)."""
        where = str(sources / self.dirname)
        return [["git", "init", "-q", where],
                ["git", "-C", where, "fetch", "-q", "--depth", "1", f"https://github.com/{self.repo}", self.rev],
                ["git", "-C", where, "checkout", "-q", "FETCH_HEAD"]]


PINS = {
    "google-beta": Pin("hashicorp/terraform-provider-google-beta", "3dc173a397749158369ea839a2890d89f8c9c370",
                       "v7.45.0",
                       "pulumi-gcp's upstream submodule (14da5bc83e 'Upgrade terraform-provider-google-beta to "
                       "v7.45.0'); pulumi-gcp bridges the beta provider, not terraform-provider-google"),
    "pulumi-gcp": Pin("pulumi/pulumi-gcp", "14da5bc83e88ea359bbe9788bd7116cb0f414adf", "v10.2.0",
                      "the commit that set the upstream pin; the installed SDK says 10.2.0 (pulumi-plugin.json)"),
    "docker": Pin("kreuzwerker/terraform-provider-docker", "5074970c71ce6cc393c74942d5d628943834beb9", "v4.5.0",
                  "pulumi-docker's upstream submodule (e944612c 'Upgrade terraform-provider-docker to v4.5.0')"),
    "pulumi-docker": Pin("pulumi/pulumi-docker", "237b7899bb513613a7645e74d6981c12d054dcc7", "v5.2.x",
                         "newest mirrored commit (tags stop at v5.1.0; the installed SDK is 5.2.0)"),
    "pulumi-kubernetes": Pin("pulumi/pulumi-kubernetes", "94977969d64112b04e19945818a7d5d5f38f631d", "v4.34.x",
                             "newest mirrored commit (2026-07-01; no v4.34 tag mirrored; the installed SDK is 4.34.2)"),
    "pulumi-command": Pin("pulumi/pulumi-command", "7f3eb6f3b77cd0fa3895ba437a695dd393f7dd25", "v1.2.1"),
    "bridge": Pin("pulumi/pulumi-terraform-bridge", "59de6c661df1e7561e6ece7ad7f1c835c63010c4", "v3.136.0",
                  "pulumi-gcp 10.2 and pulumi-docker build with v3.137.0, which is not mirrored; the rules cited "
                  "are read at v3.136.0"),
}

# Bridged (Terraform) providers: the Pulumi package prefix -> (provider pin, pulumi pin, Go module path, the Go
# directory of the provider's resources, the bridge metadata).
BRIDGED = {
    "gcp": ("google-beta", "pulumi-gcp", "github.com/hashicorp/terraform-provider-google-beta",
            "provider/cmd/pulumi-resource-gcp/bridge-metadata.json", "pulumi_gcp"),
    "docker": ("docker", "pulumi-docker", "github.com/terraform-providers/terraform-provider-docker",
               "provider/cmd/pulumi-resource-docker/bridge-metadata.json", "pulumi_docker"),
}

# CustomizeDiff functions that can force a replacement, as read (file and line are filled in from the source). A
# function not listed here that calls ForceNew stops the run: read it, then add its note.
CUSTOMIZE_DIFF_NOTES: dict[str, dict[str, Any]] = {
    "google_secret_manager_secret:secretManagerSecretAutoCustomizeDiff": {
        "paths": ["replication.automatic", "replication.auto"],
        "condition": "a change of replication.automatic or replication.auto forces a new secret, except turning "
                     "automatic from true to false while adding an auto block",
    },
    "google_container_cluster:enable_l4_ilb_subsetting": {
        "paths": ["enable_l4_ilb_subsetting"],
        "condition": "ForceNewIfChange with isBeenEnabled: a new cluster when it turns from true to false",
    },
    "google_container_cluster:enable_fqdn_network_policy": {
        "paths": ["enable_fqdn_network_policy"],
        "condition": "ForceNewIfChange with isBeenEnabled: a new cluster when it turns from true to false",
    },
    "google_container_cluster:containerClusterAutopilotCustomizeDiff": {
        "paths": ["dns_config.additive_vpc_scope_dns_domain"],
        "condition": "on an Autopilot cluster (enable_autopilot true), a change of "
                     "dns_config.additive_vpc_scope_dns_domain forces a new cluster",
    },
    "google_container_cluster:containerClusterEnableK8sBetaApisCustomizeDiff": {
        "paths": ["enable_k8s_beta_apis.enabled_apis"],
        "condition": "removing an API that was enabled from enable_k8s_beta_apis.enabled_apis forces a new cluster "
                     "(beta APIs cannot be disabled); adding one does not",
    },
    "google_compute_subnetwork:ip_cidr_range": {
        "paths": ["ip_cidr_range"],
        "condition": "ForceNewIfChange with IsShrinkageIpCidr: a new subnetwork unless the new range contains the old "
                     "one (an expansion is updated in place)",
    },
    "google_compute_instance:metadata_startup_script": {
        "paths": ["metadata_startup_script"],
        "condition": "metadata_startup_script changes force a new instance, except a graceful switch: it is set to "
                     "the old metadata['startup-script'] value, or removed while metadata['startup-script'] keeps its "
                     "old value (with no metadata at all, any change is graceful)",
    },
    "google_compute_instance:forceNewIfNetworkIPNotUpdatable": {
        "paths": ["network_interface.*.network_ip"],
        "condition": "network_interface[i].network_ip changing to a non-empty value forces a new instance unless the "
                     "same interface's network, subnetwork or subnetwork_project changes too (the interface count "
                     "being equal)",
    },
}


class SourceError(RuntimeError):
    pass


class Tree:
    """Files of one repository at one revision: a git directory read with `git show`, or a plain checkout."""

    def __init__(self, path: Path, rev: str | None):
        self.path = path
        self.git = rev is not None and (path / "HEAD").exists() or (path / ".git").exists()
        self.rev = rev or "HEAD"
        self._cache: dict[str, str] = {}
        try:
            self.commit = self._git("rev-parse", f"{self.rev}^{{commit}}").strip() if self.git else ""
        except subprocess.CalledProcessError:
            raise SourceError(f"{path} does not hold commit {self.rev}: fetch it (--fetch DIR)") from None

    def _git(self, *args: str) -> str:
        return subprocess.run(["git", f"--git-dir={self._git_dir()}", *args], check=True, capture_output=True,
                              text=True).stdout

    def _git_dir(self) -> Path:
        return self.path / ".git" if (self.path / ".git").exists() else self.path

    def read(self, rel: str) -> str:
        if rel not in self._cache:
            if self.git:
                self._batch([rel])
            else:
                try:
                    self._cache[rel] = (self.path / rel).read_text()
                except OSError as err:
                    raise SourceError(f"{self.path}: cannot read {rel}") from err
        if self._cache.get(rel) is None:
            raise SourceError(f"{self.path}: no {rel} at {self.rev}")
        return self._cache[rel]

    def _batch(self, rels: list[str]) -> None:
        """Read many blobs with one `git cat-file --batch` (a package of the provider is hundreds of files)."""
        request = "".join(f"{self.rev}:{rel}\n" for rel in rels).encode()
        out = subprocess.run(["git", f"--git-dir={self._git_dir()}", "cat-file", "--batch"], input=request,
                             check=True, capture_output=True).stdout
        pos = 0
        for rel in rels:
            header_end = out.index(b"\n", pos)
            header = out[pos:header_end].split()
            if header[-1] == b"missing":
                self._cache[rel] = None  # type: ignore[assignment]
                pos = header_end + 1
                continue
            size = int(header[2])
            self._cache[rel] = out[header_end + 1:header_end + 1 + size].decode()
            pos = header_end + 1 + size + 1

    def preload(self, rels: list[str]) -> None:
        missing = [rel for rel in rels if rel not in self._cache]
        if self.git and missing:
            self._batch(missing)

    def files(self, rel_dir: str) -> list[str]:
        if self.git:
            out = self._git("ls-tree", "--name-only", f"{self.rev}:{rel_dir}")
            names = out.split()
        else:
            names = sorted(p.name for p in (self.path / rel_dir).iterdir())
        return [f"{rel_dir}/{n}" for n in names if n.endswith(".go") and not n.endswith("_test.go")]


# --- A reader of Go composite literals -------------------------------------------------------------------------------

TOKEN = re.compile(r"""
    (?P<ws>\s+) | (?P<comment>//[^\n]*|/\*.*?\*/) | (?P<raw>`[^`]*`) | (?P<str>"(?:\\.|[^"\\\n])*") |
    (?P<char>'(?:\\.|[^'\\])+') | (?P<num>\d[\w.]*) | (?P<id>[A-Za-z_]\w*) |
    (?P<op>\.\.\.|:=|&&|\|\||==|!=|<=|>=|<-|\+\+|--|[-+*/%&|^!<>=.,;:(){}\[\]])
""", re.S | re.X)


@dataclass(frozen=True)
class Tok:
    kind: str
    text: str
    line: int


def tokenize(text: str) -> list[Tok]:
    out, pos, line = [], 0, 1
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m:
            raise SourceError(f"cannot tokenize at line {line}: {text[pos:pos + 40]!r}")
        kind = m.lastgroup
        if kind not in ("ws", "comment"):
            out.append(Tok(kind, m.group(), line))
        line += m.group().count("\n")
        pos = m.end()
    return out


@dataclass
class Node:
    kind: str  # composite | str | ref | call | func | raw
    text: str = ""  # type of a composite, value of a str, name of a ref or call
    items: list[tuple[Node | None, Node]] = field(default_factory=list)  # composite elements: (key, value)
    args: list[Node] = field(default_factory=list)
    line: int = 0
    ctx: Context | None = None  # where names in it resolve

    def get(self, key: str) -> Node | None:
        for k, v in self.items:
            if k is not None and k.kind in ("ref", "str") and k.text == key:
                return v
        return None


OPEN = {"(": ")", "[": "]", "{": "}"}


class Parser:
    def __init__(self, toks: list[Tok], ctx: Context):
        self.toks, self.i, self.ctx = toks, 0, ctx

    def peek(self, k: int = 0) -> Tok | None:
        return self.toks[self.i + k] if self.i + k < len(self.toks) else None

    def take(self, text: str | None = None) -> Tok:
        tok = self.toks[self.i]
        if text is not None and tok.text != text:
            raise SourceError(f"{self.ctx.file}:{tok.line}: expected {text!r}, found {tok.text!r}")
        self.i += 1
        return tok

    def skip_group(self) -> None:
        """Skip a bracketed group starting at the current token."""
        depth = 0
        while True:
            tok = self.take()
            if tok.text in OPEN:
                depth += 1
            elif tok.text in (")", "]", "}"):
                depth -= 1
                if depth == 0:
                    return

    def type_text(self) -> str:
        """A type before a composite literal's '{': map[string]*schema.Schema, []string, schema.Resource, ..."""
        parts = []
        while self.peek() and self.peek().text != "{":
            tok = self.take()
            if tok.text == "[":
                parts.append("[")
                while self.peek().text != "]":
                    parts.append(self.take().text)
                parts.append(self.take().text)
            else:
                parts.append(tok.text)
        return "".join(parts)

    def expr(self) -> Node:
        node = self.unary()
        while self.peek() and self.peek().text in ("+", "-", "*", "/", "||", "&&", "==", "!=", "<", ">", "<=", ">=",
                                                    "|", "&", "%"):
            op = self.take().text
            right = self.unary()
            node = Node("raw", f"{node.text} {op} {right.text}", line=node.line, ctx=self.ctx,
                        args=[node, right])
        return node

    def unary(self) -> Node:
        tok = self.peek()
        if tok.text in ("&", "*", "!", "-"):
            self.take()
            return self.unary()
        if tok.text == "func":
            line = self.take().line
            self.skip_group()  # parameters
            while self.peek().text != "{":
                if self.peek().text in OPEN:
                    self.skip_group()
                else:
                    self.take()
            start = self.i
            self.skip_group()
            return Node("func", " ".join(t.text for t in self.toks[start:self.i]), line=line, ctx=self.ctx)
        if tok.text in ("map", "[") or (tok.text == "struct"):
            line = tok.line
            typ = self.type_text()
            return self.composite(typ, line)
        if tok.text == "{":
            return self.composite("", tok.line)
        if tok.kind in ("str", "raw"):
            self.take()
            value = tok.text[1:-1] if tok.kind == "raw" else json.loads(tok.text)
            node = Node("str", value, line=tok.line, ctx=self.ctx)
            while self.peek() and self.peek().text == "+" and self.peek(1).kind in ("str", "raw"):
                self.take()
                nxt = self.take()
                node.text += nxt.text[1:-1] if nxt.kind == "raw" else json.loads(nxt.text)
            return node
        if tok.kind in ("num", "char"):
            self.take()
            return Node("raw", tok.text, line=tok.line, ctx=self.ctx)
        if tok.text == "(":
            self.take()
            node = self.expr()
            self.take(")")
            return node
        if tok.kind == "id":
            name = self.take().text
            while self.peek() and self.peek().text == "." and self.peek(1).kind == "id":
                self.take()
                name += "." + self.take().text
            node = Node("ref", name, line=tok.line, ctx=self.ctx)
            while self.peek():
                if self.peek().text == "(":
                    self.take()
                    args = []
                    while self.peek().text != ")":
                        args.append(self.expr())
                        if self.peek().text == "...":
                            self.take()
                        if self.peek().text == ",":
                            self.take()
                    self.take(")")
                    node = Node("call", name, args=args, line=tok.line, ctx=self.ctx)
                elif self.peek().text == "{" and node.kind == "ref":
                    node = self.composite(name, tok.line)
                elif self.peek().text == "[":
                    self.skip_group()
                    node = Node("raw", name, line=tok.line, ctx=self.ctx)
                elif self.peek().text == "." and self.peek(1).kind == "id":
                    self.take()
                    name = f"{name}().{self.take().text}"
                    node = Node("raw", name, line=tok.line, ctx=self.ctx)
                else:
                    break
            return node
        raise SourceError(f"{self.ctx.file}:{tok.line}: unexpected {tok.text!r}")

    def composite(self, typ: str, line: int) -> Node:
        node = Node("composite", typ, line=line, ctx=self.ctx)
        self.take("{")
        while self.peek().text != "}":
            value = self.expr()
            key = None
            if self.peek().text == ":":
                self.take()
                key, value = value, self.expr()
            node.items.append((key, value))
            if self.peek().text == ",":
                self.take()
        self.take("}")
        return node


@dataclass
class Context:
    """One Go file: its package directory, its imports, and arguments bound by a call being expanded."""

    tree: Tree
    module: str
    file: str
    bindings: dict[str, Node] = field(default_factory=dict)

    @property
    def package_dir(self) -> str:
        return self.file.rsplit("/", 1)[0]

    def imports(self) -> dict[str, str]:
        text = self.tree.read(self.file)
        out = {}
        for block in re.findall(r"^import\s*\((.*?)^\)", text, re.S | re.M) + re.findall(r'^import\s+(.+)$', text,
                                                                                          re.M):
            for alias, path in re.findall(r'^\s*(\w+\s+)?"([^"]+)"', block, re.M):
                name = alias.strip() or path.rsplit("/", 1)[-1]
                out[name] = path
        return out

    def package_of(self, qualifier: str) -> str | None:
        path = self.imports().get(qualifier)
        if path and path.startswith(self.module + "/"):
            return path[len(self.module) + 1:]
        return None


class Source:
    """Top-level declarations of a Go repository, found on demand."""

    def __init__(self, tree: Tree, module: str):
        self.tree, self.module = tree, module
        self._decls: dict[str, dict[str, tuple[str, int]]] = {}

    def declarations(self, package_dir: str) -> dict[str, tuple[str, int]]:
        """name -> (file, token index of the declaration's value or body) for every top-level func and var."""
        if package_dir not in self._decls:
            decls: dict[str, tuple[str, int]] = {}
            self.tree.preload(self.tree.files(package_dir))
            for file in self.tree.files(package_dir):
                text = self.tree.read(file)
                for m in re.finditer(r"^func (\w+)\(|^var (\w+)\b|^\t(\w+)\s*=[^=]", text, re.M):
                    decls.setdefault(m.group(1) or m.group(2) or m.group(3), (file, m.start()))
            self._decls[package_dir] = decls
        return self._decls[package_dir]

    def tokens(self, file: str) -> list[Tok]:
        key = f"tokens:{file}"
        cache = self.tree._cache
        if key not in cache:
            cache[key] = tokenize(self.tree.read(file))  # type: ignore[assignment]
        return cache[key]  # type: ignore[return-value]

    def _locate(self, ctx: Context, name: str) -> tuple[Context, str, int]:
        if "." in name:
            qualifier, local = name.split(".", 1)
            package = ctx.package_of(qualifier)
            if package is None:
                raise SourceError(f"{ctx.file}: {name}: package {qualifier} is not part of {self.module}")
        else:
            package, local = ctx.package_dir, name
        found = self.declarations(package).get(local)
        if found is None:
            raise SourceError(f"{ctx.file}: no declaration of {name} in {package}")
        file, offset = found
        line = self.tree.read(file).count("\n", 0, offset) + 1
        return Context(self.tree, self.module, file), local, line

    def var(self, ctx: Context, name: str) -> Node:
        """The value of `var name = <expr>` (also inside a `var (...)` block)."""
        vctx, local, line = self._locate(ctx, name)
        toks = self.tokens(vctx.file)
        start = next(i for i, t in enumerate(toks) if t.line == line and t.text == local)
        parser = Parser(toks, vctx)
        parser.i = start + 1
        if parser.peek().text != "=":
            parser.type_text() if parser.peek().text != "{" else None
        parser.take("=")
        return parser.expr()

    def func(self, ctx: Context, name: str) -> tuple[Context, list[str], list[Tok], int]:
        """A function's context, parameter names, body tokens (without the braces) and first line."""
        fctx, local, line = self._locate(ctx, name)
        toks = self.tokens(fctx.file)
        start = next(i for i, t in enumerate(toks) if t.line == line and t.text == local)
        parser = Parser(toks, fctx)
        parser.i = start + 1
        params_start = parser.i
        parser.skip_group()
        params = [toks[i].text for i in range(params_start + 1, parser.i - 1)
                  if toks[i].kind == "id" and toks[i - 1].text in ("(", ",")]
        while parser.peek().text != "{":
            parser.skip_group() if parser.peek().text in ("(", "[") else parser.take()
        body_start = parser.i
        parser.skip_group()
        return fctx, params, toks[body_start + 1:parser.i - 1], line

    def returned(self, ctx: Context, call: Node) -> Node:
        """The composite literal a function returns, with the call's arguments bound to its parameters."""
        fctx, params, body, _ = self.func(ctx, call.text)
        fctx.bindings = dict(zip(params, call.args))
        returns, depth = [], 0
        for i, t in enumerate(body):
            depth += 1 if t.text in OPEN else -1 if t.text in (")", "]", "}") else 0
            if depth == 0 and t.text == "return":
                returns.append(i)
        for index in reversed(returns):
            parser = Parser(body, fctx)
            parser.i = index + 1
            node = parser.expr()
            if node.kind == "ref" and "." not in node.text:  # `x := &schema.Resource{...}; ...; return x`
                assign = [i for i, t in enumerate(body[:index]) if t.text == node.text and body[i + 1].text == ":="]
                if not assign:
                    continue
                parser.i = assign[-1] + 2
                node = parser.expr()
            if node.kind in ("composite", "call"):
                return node
        raise SourceError(f"{fctx.file}: {call.text} returns no literal this reader knows")


# --- Terraform SDKv2 schemas -----------------------------------------------------------------------------------------

@dataclass
class Attr:
    name: str
    type: str  # TypeString, TypeList, ...
    force_new: bool
    computed: bool
    optional: bool
    max_items: int | None
    file: str
    line: int
    elem: dict[str, Attr] | None = None  # nested block
    elem_type: str | None = None  # a list/set/map of primitives


class SchemaReader:
    def __init__(self, source: Source):
        self.source = source

    def deref(self, node: Node) -> Node:
        """Follow a reference to a bound argument or a package variable."""
        seen = 0
        while node.kind == "ref" and seen < 20:
            seen += 1
            if node.ctx is not None and node.text in node.ctx.bindings:
                bound = node.ctx.bindings[node.text]
                node = bound
                continue
            if node.text in ("true", "false", "nil") or node.text.startswith("schema.Type"):
                return node
            node = self.source.var(node.ctx, node.text)
        return node

    def flag(self, node: Node | None) -> bool:
        if node is None:
            return False
        node = self.deref(node)
        if node.kind == "ref" and node.text in ("true", "false"):
            return node.text == "true"
        raise SourceError(f"{node.ctx.file}:{node.line}: a flag this reader cannot evaluate: {node.text!r}")

    def resource(self, node: Node) -> Node:
        node = self.deref(node)
        if node.kind == "call":
            return self.resource(self.source.returned(node.ctx, node))
        if node.kind == "composite" and node.text.endswith("Resource"):
            return node
        raise SourceError(f"{node.ctx.file}:{node.line}: not a schema.Resource: {node.text!r}")

    def schema_map(self, node: Node) -> dict[str, Attr]:
        node = self.deref(node)
        if node.kind == "call" and node.text.endswith("MergeSchemas"):
            merged: dict[str, Attr] = {}
            for arg in node.args:
                merged.update(self.schema_map(arg))
            return merged
        if node.kind == "call":
            return self.schema_map(self.source.returned(node.ctx, node))
        if node.kind != "composite" or not node.text.startswith("map[string]"):
            raise SourceError(f"{node.ctx.file}:{node.line}: not a schema map: {node.text!r}")
        return {key.text: self.attr(key.text, value) for key, value in node.items}

    def attr(self, name: str, node: Node) -> Attr:
        node = self.deref(node)
        if node.kind == "call":
            node = self.source.returned(node.ctx, node)
            node = self.deref(node)
        if node.kind != "composite":
            raise SourceError(f"{node.ctx.file}:{node.line}: {name}: not a schema literal")
        typ = self.deref(node.get("Type")).text.removeprefix("schema.")
        max_items = node.get("MaxItems")
        attr = Attr(name, typ, self.flag(node.get("ForceNew")), self.flag(node.get("Computed")),
                    self.flag(node.get("Optional")) or self.flag(node.get("Required")),
                    int(self.deref(max_items).text) if max_items is not None else None, node.ctx.file, node.line)
        elem = node.get("Elem")
        if elem is not None:
            elem = self.deref(elem)
            if elem.kind == "call":
                elem = self.deref(self.source.returned(elem.ctx, elem))
            if elem.kind == "composite" and elem.text.endswith("Resource"):
                attr.elem = self.schema_map(elem.get("Schema"))
            elif elem.kind == "composite" and elem.text.endswith("Schema"):
                attr.elem_type = self.deref(elem.get("Type")).text.removeprefix("schema.")
            else:
                raise SourceError(f"{node.ctx.file}:{node.line}: {name}: Elem this reader does not know")
        return attr


def walk(attrs: dict[str, Attr], prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Attr]]:
    for name in sorted(attrs):
        attr = attrs[name]
        yield (*prefix, name), attr
        if attr.elem:
            yield from walk(attr.elem, (*prefix, name))


# --- Terraform names -> the Pulumi input names the engine sees -------------------------------------------------------

class PulumiNames:
    """Maps a Terraform attribute path to the Pulumi property path: each name as the Python SDK's input types spell it
    (the `@pulumi.getter(name=...)` of the resource's Args class and its nested Args classes), which is the bridge's
    name mapping (lowerCamelCase, plural for lists that are not MaxItemsOne) as shipped."""

    def __init__(self, sdk: str, metadata: dict[str, Any]):
        self.sdk, self.metadata = sdk, metadata

    def args_class(self, token: str) -> type:
        import importlib

        _, module_path, name = token.split(":")
        package = module_path.split("/")[0]
        module = importlib.import_module(self.sdk if package == "index" else f"{self.sdk}.{package.lower()}")
        return getattr(module, f"{name}Args")

    @staticmethod
    def getters(cls: type) -> dict[str, tuple[str, str]]:
        """python attribute -> (pulumi name, annotation text) of an Args class."""
        out = {}
        for attr, value in vars(cls).items():
            if isinstance(value, property) and value.fget is not None:
                pulumi_name = getattr(value.fget, "_pulumi_name", attr)
                out[attr] = (pulumi_name, str(value.fget.__annotations__.get("return", "")))
        return out

    def nested(self, cls: type, annotation: str) -> type | None:
        found = re.findall(r"'(\w+Args)'", annotation)
        if not found:
            return None
        import importlib

        module = importlib.import_module(cls.__module__.rsplit(".", 1)[0] + "._inputs")
        return getattr(module, found[-1])

    def path(self, token: str, tf_path: tuple[str, ...], tf_resource: str) -> str | None:
        """The Pulumi path pattern of a TF path (`[*]` for the elements of a list that is not flattened), or None
        when pulumi-gcp offers no such input (a field it hides, such as a deprecated one)."""
        tf_path = tuple(p for p in tf_path if p != "*" and not p.isdigit())
        cls: type | None = self.args_class(token)
        fields = self.metadata.get(tf_resource, {}).get("fields", {})
        parts: list[str] = []
        for depth, name in enumerate(tf_path):
            if cls is None:
                raise SourceError(f"{token}: no input type for {'.'.join(tf_path[:depth])}")
            getters = self.getters(cls)
            candidates = [name, name + "s", name + "es", name[:-1] + "ies" if name.endswith("y") else None]
            attr = next((c for c in candidates if c in getters), None)
            if attr is None:
                return None
            pulumi_name, annotation = getters[attr]
            parts.append(pulumi_name)
            info = fields.get(name, {})
            if depth < len(tf_path) - 1 and "Sequence[" in annotation and not info.get("maxItemsOne"):
                parts.append("[*]")
            cls = self.nested(cls, annotation)
            fields = info.get("elem", {}).get("fields", {})
        return "".join(p if p == "[*]" or i == 0 else "." + p for i, p in enumerate(parts))


# --- The facts -------------------------------------------------------------------------------------------------------

def bridged_resource(trees: dict[str, Tree], prefix: str, token: str, names_cache: dict[str, Any]) -> dict[str, Any]:
    provider_key, pulumi_key, module, metadata_path, sdk = BRIDGED[prefix]
    tree, pulumi_tree = trees[provider_key], trees[pulumi_key]
    if ("meta", prefix) not in names_cache:
        names_cache[("meta", prefix)] = json.loads(pulumi_tree.read(metadata_path))
    metadata = names_cache[("meta", prefix)]
    aliases = metadata["auto-aliasing"]["resources"]
    tf_name = next((name for name, info in aliases.items() if info.get("current") == token), None)
    if tf_name is None:
        raise SourceError(f"{token}: not in {pulumi_key}'s bridge metadata")
    mux = metadata.get("mux", {}).get("resources", {}).get(token, 0)
    if mux != 0:
        raise SourceError(f"{token}: muxed to the plugin-framework provider ({mux}); this reader reads SDKv2 schemas")
    source = names_cache.setdefault(("source", prefix), Source(tree, module))
    registration = find_registration(tree, module, tf_name)
    reader = SchemaReader(source)
    resource = reader.resource(registration)
    attrs = reader.schema_map(resource.get("Schema"))
    names = PulumiNames(sdk, aliases)
    force_new, computed, sets = [], [], []
    for tf_path, attr in walk(attrs):
        if not attr.optional:
            continue
        pulumi_path = names.path(token, tf_path, tf_name)
        if pulumi_path is not None and attr.type == "TypeSet":
            sets.append(pulumi_path)
        if not attr.force_new:
            if attr.computed and pulumi_path is not None:
                computed.append(pulumi_path)
            continue
        kind = ("map" if attr.type == "TypeMap" else
                "block" if attr.elem is not None and attr.max_items == 1 and _max_items_one(aliases, tf_name, tf_path)
                else attr.type.removeprefix("Type").lower())
        force_new.append({"path": pulumi_path, "tf": ".".join(tf_path), "kind": kind, "computed": attr.computed,
                          "file": attr.file, "line": attr.line})
    main_file = resource.ctx.file
    for entry in force_new:
        if entry["file"] == main_file:
            del entry["file"]
    facts: dict[str, Any] = {
        "provider": provider_key, "terraform": tf_name, "file": main_file, "line": resource.line,
        "force_new": force_new,
        # Optional+Computed inputs that are not ForceNew: removing one keeps the old value (no diff), as for the
        # ForceNew entries marked computed.
        "computed": computed,
        "sets": sets,  # TypeSet inputs: compared as sets of elements, not by position
        "customize_diff": customize_diff(source, reader, resource, tf_name, token, names),
        "delete_before_replace": delete_before_replace_rule(pulumi_tree, tf_name, attrs, token, names),
    }
    if tf_name == "google_compute_instance":
        facts["update"] = instance_update(source, resource, token, names, tf_name)
    return facts


def _max_items_one(aliases: dict[str, Any], tf_name: str, tf_path: tuple[str, ...]) -> bool:
    fields = aliases.get(tf_name, {}).get("fields", {})
    info: dict[str, Any] = {}
    for name in tf_path:
        info = fields.get(name, {})
        fields = info.get("elem", {}).get("fields", {})
    return bool(info.get("maxItemsOne"))


def find_registration(tree: Tree, module: str, tf_name: str) -> Node:
    """The schema.Resource expression registered under `tf_name`: a `registry.Schema{Name: ..., Schema: X}` block
    (google-beta) or a `ResourcesMap` entry `"name": X` (SDKv2 providers' provider.go)."""
    for file in _registrations(tree).get(tf_name, []):
        toks = tokenize(tree.read(file))
        ctx = Context(tree, module, file)
        for i, tok in enumerate(toks):
            if tok.kind != "str" or json.loads(tok.text) != tf_name or toks[i + 1].text not in (",", ":"):
                continue
            if toks[i - 1].text == ":" and toks[i - 2].text == "Name":
                j = i
                while toks[j].text != "{":
                    j -= 1
                parser = Parser(toks, ctx)
                parser.i = j
                block = parser.composite("registry.Schema", toks[j].line)
                kind = block.get("Type")
                if kind is not None and kind.text in ("registry.SchemaTypeResource", "registry.SchemaTypeIAMResource"):
                    return block.get("Schema")
            elif toks[i + 1].text == ":" and toks[i - 1].text in ("{", ","):
                parser = Parser(toks, ctx)
                parser.i = i + 2
                node = parser.expr()
                if node.kind == "call" and node.text[0].islower():  # resourceDockerContainer()
                    return node
    raise SourceError(f"{tree.path}: no resource registration for {tf_name}")


_REGISTRATIONS: dict[Path, dict[str, list[str]]] = {}


def _registrations(tree: Tree) -> dict[str, list[str]]:
    """Terraform resource name -> the files that may register it (one grep of the whole provider)."""
    if tree.path not in _REGISTRATIONS:
        pattern = r'Name:\s*"[a-z0-9_]+"|^\s*"[a-z0-9_]+":\s*\w+\(\)'
        if tree.git:
            out = subprocess.run(["git", f"--git-dir={tree._git_dir()}", "grep", "-E", pattern, tree.rev, "--",
                                  "*.go"], capture_output=True, text=True).stdout
            hits = [(line.split(":", 2)[1], line.split(":", 2)[2]) for line in out.splitlines()]
        else:
            hits = [(str(p.relative_to(tree.path)), line) for p in tree.path.rglob("*.go")
                    for line in p.read_text().splitlines() if re.search(pattern, line)]
        index: dict[str, list[str]] = {}
        for file, line in hits:
            if file.endswith("_test.go"):
                continue
            for name in re.findall(r'"([a-z0-9_]+)"', line)[:1]:
                index.setdefault(name, []).append(file)
        _REGISTRATIONS[tree.path] = {k: list(dict.fromkeys(v)) for k, v in index.items()}
    return _REGISTRATIONS[tree.path]


def customize_diff(source: Source, reader: SchemaReader, resource: Node, tf_name: str, token: str,
                   names: PulumiNames) -> list[dict[str, Any]]:
    node = resource.get("CustomizeDiff")
    if node is None:
        return []
    node = reader.deref(node)
    entries = node.args if node.kind == "call" and node.text.endswith("customdiff.All") else [node]
    out = []
    for entry in entries:
        entry = reader.deref(entry) if entry.kind == "ref" and entry.text in entry.ctx.bindings else entry
        if entry.kind == "call" and entry.text.startswith("customdiff.ForceNewIf"):
            path = reader.deref(entry.args[0]).text
            func = entry.args[1]
            called = re.findall(r"(\w+) \( d \)", func.text) if func.kind == "func" else [func.text]
            key = f"{tf_name}:{path}"
            note = CUSTOMIZE_DIFF_NOTES.get(key)
            if note is None:
                raise SourceError(f"{entry.ctx.file}:{entry.line}: {entry.text}({path!r}, ...) in {tf_name}: read it "
                                  f"and add a note for {key!r} to CUSTOMIZE_DIFF_NOTES")
            out.append({"function": f"{entry.text}({path!r}, {called[0] if called else func.text})",
                        "force_new": True, "paths": [names.path(token, tuple(p.split(".")), tf_name)
                                                     for p in note["paths"]],
                        "condition": note["condition"], "file": entry.ctx.file, "line": entry.line})
            continue
        if entry.kind == "call":  # a constructor such as customdiff.If(cond, f) or DefaultProviderDeletionPolicy(x)
            name = entry.text
            inner = [a.text for a in entry.args if a.kind == "ref"]
            body = " ".join(_body_text(source, entry.ctx, n) for n in [name, *inner] if not n.startswith("customdiff"))
        elif entry.kind == "ref":
            name = entry.text
            body = _body_text(source, entry.ctx, name)
        else:
            raise SourceError(f"{entry.ctx.file}:{entry.line}: CustomizeDiff entry this reader does not know")
        # A diff's own ForceNew (d.ForceNew, diff.ForceNew), here or in what it calls; customdiff.ForceNew* inside a
        # callee is another resource's constructor, not this rule.
        forces = bool(re.search(r"\b(?!customdiff\b)\w+ \. ForceNew \(", body))
        item: dict[str, Any] = {"function": name, "force_new": forces, "file": entry.ctx.file, "line": entry.line}
        if forces:
            key = f"{tf_name}:{name.rsplit('.', 1)[-1]}"
            note = CUSTOMIZE_DIFF_NOTES.get(key)
            if note is None:
                raise SourceError(f"{entry.ctx.file}:{entry.line}: {name} in {tf_name}'s CustomizeDiff can force a "
                                  f"new resource: read it and add a note for {key!r} to CUSTOMIZE_DIFF_NOTES")
            fctx, _, _, line = source.func(entry.ctx, name)
            item.update(paths=[names.path(token, tuple(p.split(".")), tf_name)
                               for p in note["paths"]], condition=note["condition"], file=fctx.file, line=line)
        out.append(item)
    return out


def _body_text(source: Source, ctx: Context, name: str, depth: int = 0) -> str:
    """A function's body, and the bodies of same-repository functions it calls (two levels), as text."""
    try:
        fctx, _, body, _ = source.func(ctx, name)
    except SourceError:
        return ""
    text = " ".join(t.text for t in body)
    if depth < 2:
        for called in sorted(set(re.findall(r"\b([A-Za-z_][\w.]*) \(", text)) - {name}):
            if called.split(".")[0] in ("d", "fmt", "log", "strings", "errors", "schema", "len", "make", "append"):
                continue
            text += " " + _body_text(source, fctx, called, depth + 1)
    return text


def delete_before_replace_rule(pulumi_tree: Tree, tf_name: str, attrs: dict[str, Attr], token: str,
                               names: PulumiNames) -> dict[str, Any]:
    """pulumi-terraform-bridge (pkg/tfbridge/provider.go Diff): a replacement the provider asks for is
    delete-before-replace when the resource's info says DeleteBeforeReplace, or when an auto-named input was given
    explicitly rather than filled in by the autonamer (schema.go nameRequiresDeleteBeforeReplace). pulumi-gcp
    auto-names the fields its resources.go names with AutoName, and `name` on every other resource with an input
    string `name` (SetAutonaming, pkg/tfbridge/info/autonaming.go)."""
    text = pulumi_tree.read("provider/resources.go")
    info, file, line = "", "provider/resources.go", 0
    m = re.search(rf'^\t+"{re.escape(tf_name)}":\s*(?:{{|(\w+)\(\),)', text, re.M)
    if m and m.group(1):  # "google_x": resourceX(), a function in another file of the package
        for other in pulumi_tree.files("provider"):
            body = re.search(rf"^func {m.group(1)}\(\).*?^}}", pulumi_tree.read(other), re.S | re.M)
            if body:
                info, file = body.group(), other
                line = pulumi_tree.read(other).count("\n", 0, body.start()) + 1
                break
    elif m:
        line = text.count("\n", 0, m.start()) + 1
        depth, i = 0, m.end() - 1
        while True:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
            if depth == 0:
                break
        info = text[m.start():i]
    explicit = bool(re.search(r"DeleteBeforeReplace:\s*true", info))
    autonamed = re.findall(r'"(\w+)":\s*(?:tfbridge|info)\.AutoName\w*\(', info)
    if "nameField(" in info:
        autonamed.append("name")
    has_name_info = bool(re.search(r'"name":', info))
    name_attr = attrs.get("name")
    if (not has_name_info and name_attr is not None and name_attr.optional and name_attr.type == "TypeString"
            and re.search(r"prov\.SetAutonaming\(", text)):
        autonamed.append("name")
    return {"explicit": explicit, "autonamed": sorted({names.path(token, (n,), tf_name) for n in autonamed}),
            "file": file, "line": line}


def instance_update(source: Source, resource: Node, token: str, names: PulumiNames, tf_name: str) -> dict[str, Any]:
    """resourceComputeInstanceUpdate: its update calls in order, the stop list, and the refusal."""
    ctx = resource.ctx
    update = resource.get("Update")
    fctx, _, body, line = source.func(ctx, update.text)
    text_of = lambda toks: " ".join(t.text for t in toks)  # noqa: E731
    calls, depth, i = [], 0, 0
    stop_line, stop_expr = 0, ""
    while i < len(body):
        tok = body[i]
        if depth == 0 and tok.text in ("if", "for"):
            parser = Parser(body, fctx)
            parser.i = i + 1
            while parser.peek().text != "{":
                parser.skip_group() if parser.peek().text in ("(", "[") else parser.take()
            j = parser.i
            condition = text_of(body[i + 1:j])
            parser.skip_group()
            block = text_of(body[j:parser.i])
            api = list(dict.fromkeys(re.findall(r'instances/\{\{name\}\}/(\w+)"|\+ "/(\w+)"', block)))
            api = [a or b for a, b in api]
            if not api and re.search(r'Method : "(PUT|PATCH)"', block):
                api = re.findall(r'Method : "(PUT|PATCH)"', block)[:1]
            if api:
                calls.append({"when": condition, "calls": api, "line": tok.line})
            i = parser.i
            continue
        if tok.text in OPEN:
            depth += 1
        elif tok.text in ("}", ")", "]"):
            depth -= 1
        if depth == 0 and tok.text == "needToStopInstanceBeforeUpdating" and body[i + 1].text == ":=":
            stop_line = tok.line
            j = i + 2
            while body[j].line == stop_line:
                j += 1
            stop_expr = text_of(body[i + 2:j])
        i += 1
    first = next(k for k, t in enumerate(body) if t.kind == "str" and "requires stopping it" in t.text)
    while body[first - 1].kind == "str" or body[first - 1].text == "+":
        first -= 1
    last = first
    while body[last + 1].kind == "str" or body[last + 1].text == "+":
        last += 1
    refusal = "".join(json.loads(t.text) for t in body[first:last + 1] if t.kind == "str")
    refuse_line = body[first].line
    stop_call = next(t for t in body if t.kind == "str" and t.text.endswith('/stop"') and t.line > refuse_line)
    stopped = []
    for tok_i, tok in enumerate(body):
        if tok.line > refuse_line and tok.text == "HasChange" and body[tok_i + 2].kind == "str":
            stopped.append((json.loads(body[tok_i + 2].text), tok.line))

    paths: list[dict[str, Any]] = []

    def add(tf: str, line_no: int, how: str, file: str = fctx.file) -> None:
        paths.append({"path": names.path(token, tuple(tf.split(".")), tf_name), "tf": tf, "via": how,
                      "file": file, "line": line_no})

    for key in re.findall(r'd \. HasChange \( "([\w.]+)" \)', stop_expr):
        add(key, stop_line, "HasChange")
    if "scopesChange" in stop_expr:
        scopes_line = next(t.line for t in body if t.text == "scopesChange")
        add("service_account.0.scopes", scopes_line, "scopesChange: service_account's scopes set differs")
    if "updatesToNIWhileStopped" in stop_expr:
        during = next(k for k, t in enumerate(body) if t.text == "updateDuringStop" and body[k + 1].text == ":=")
        ni_line = body[during].line
        for key in re.findall(r'HasChange \( prefix \+ "\.(\w+)" \)', text_of([t for t in body if t.line == ni_line])):
            add(f"network_interface.*.{key}", ni_line, "updateDuringStop")
    if "bootRequiredSchedulingChange" in stop_expr:
        helper = next(body[k + 2].text for k, t in enumerate(body)
                      if t.text == "bootRequiredSchedulingChange" and body[k + 1].text == ":=")
        hctx, _, hbody, _ = source.func(fctx, helper)
        for called in re.findall(r"(\w+) \(", text_of(hbody)):
            if called in ("GetChange", "d"):
                continue
            cctx, _, cbody, cline = source.func(hctx, called)
            ctext = text_of(cbody)
            keys = re.findall(r'Scheduling \[ "(\w+)" \]', ctext)
            condition = ""
            if not keys:  # a wrapper: follow it once
                inner = [c for c in re.findall(r"(\w+) \(", ctext) if c.startswith("has")]
                cctx, _, ibody, cline = source.func(cctx, inner[0])
                keys = re.findall(r'Scheduling \[ "(\w+)" \]', text_of(ibody))
                if "allow_stopping_for_update" in ctext:
                    condition = " (only counted when allow_stopping_for_update is true)"
            add(f"scheduling.{keys[0]}", cline, f"{helper} -> {called}{condition}", cctx.file)
            if condition:
                paths[-1]["only_if"] = names.path(token, ("allow_stopping_for_update",), tf_name)
    return {
        "function": update.text, "file": fctx.file, "line": line,
        "order": calls,
        "stop_check": {"line": stop_line, "expression": stop_expr},
        "needs_stop": paths,
        "refusal": {"line": refuse_line, "text": refusal,
                    "when": "the instance is RUNNING, desired_status is not TERMINATED and allow_stopping_for_update "
                            "is false"},
        "stop_call_line": stop_call.line,
        "while_stopped": [{"change": key, "line": ln} for key, ln in stopped],
        "partial": "d.Partial(true): an update that fails after setMetadata leaves the VM with the new metadata and "
                   "the state with the old",
    }


def kubernetes_facts(tree: Tree, kinds: list[str]) -> dict[str, Any]:
    """pulumi-kubernetes provider/pkg/provider/diff.go forceNewProperties: `.metadata.name` and `.metadata.namespace`
    of every kind, then the `forceNew` table by group, version and kind, its helpers expanded."""
    path = "provider/pkg/provider/diff.go"
    text = tree.read(path)
    toks = tokenize(text)
    ctx = Context(tree, "", path)
    helpers = {m.group(1): re.findall(r'prefix \+ "([^"]+)"', m.group(2)) for m in
               re.finditer(r"^func (\w+)\((?:prefix string|prefixes \.\.\.string)\) properties \{(.*?)^\}", text,
                          re.S | re.M)}

    def var(name: str) -> Node:
        index = next(i for i, t in enumerate(toks) if t.text == "var" and toks[i + 1].text == name)
        parser = Parser(toks, ctx)
        parser.i = index + 3
        return parser.expr()

    def strings(node: Node) -> list[str]:
        if node.kind == "str":
            return [node.text]
        if node.kind == "ref":
            return strings(var(node.text))
        if node.kind == "composite":
            return [s for _, item in node.items for s in strings(item)]
        if node.kind == "call" and node.text == "append":
            return [s for arg in node.args for s in strings(arg)]
        if node.kind == "call" and node.text in helpers:
            return [prefix + suffix for arg in node.args for prefix in strings(arg) for suffix in helpers[node.text]]
        raise SourceError(f"{path}:{node.line}: {node.text!r}: an expression this reader does not know")

    groups = var("forceNew")
    metadata_line = next(t.line for i, t in enumerate(toks) if t.text == "metadataForceNewProperties"
                         and toks[i - 1].text == "func")
    out: dict[str, Any] = {}
    for token in kinds:
        _, api, kind = token.split(":")
        group, _, version = api.rpartition("/")
        group = "core" if group in ("", "core") else group
        paths, line = ["metadata" + p for p in helpers["metadataForceNewProperties"]], metadata_line
        versions = groups.get(group)
        versions = var(versions.text) if versions is not None and versions.kind == "ref" else versions
        kinds_node = versions.get(version) if versions is not None else None
        fields = kinds_node.get(kind) if kinds_node is not None else None
        if fields is not None:
            paths += strings(fields)
            line = fields.line
        facts: dict[str, Any] = {
            "provider": "pulumi-kubernetes",
            "force_new": [{"path": p.lstrip("."), "kind": "prefix"} for p in dict.fromkeys(paths)],
            "file": path, "line": line,
            "delete_before_replace": {
                "explicit": False, "autonamed": ["metadata.name"], "same_name": True,
                "file": "provider/pkg/provider/provider.go",
                "line": tree.read("provider/pkg/provider/provider.go").count(
                    "\n", 0, tree.read("provider/pkg/provider/provider.go").index("deleteBeforeReplace := ")) + 1,
                "note": "the provider replaces, metadata.name is set (not generateName, not auto-named) and neither "
                        "it nor the namespace changes"},
        }
        conditional = {"ConfigMap": ("IsConfigMap", ["binaryData", "data"], "enableConfigMapMutable"),
                       "Secret": ("IsSecret", ["type", "stringData", "data"], "enableSecretMutable")}.get(kind)
        if conditional and group == "core":
            check, extra, option = conditional
            facts["force_new"] += [{"path": p, "kind": "prefix", "unless_provider_option": option} for p in extra]
            facts["conditional_line"] = text.count("\n", 0, text.index(f"clients.{check}(obj)")) + 1
        out[token] = facts
    return out


def kubernetes_provider_facts(tree: Tree) -> dict[str, Any]:
    """pulumi-kubernetes provider.go DiffConfig: the provider (and with it every object it manages) is replaced when
    the active cluster of its kubeconfig changes, or its kubeconfig/context/cluster settings do."""
    path = "provider/pkg/provider/provider.go"
    text = tree.read(path)
    start = text.index("func (k *kubeProvider) DiffConfig(")
    active = text.index("getActiveClusterFromConfig(newConfig, news)", start)
    line = lambda offset: text.count("\n", 0, offset) + 1  # noqa: E731
    return {"provider": "pulumi-kubernetes-provider", "file": path, "line": line(start), "force_new": [],
            "active_cluster": {"keys": ["kubeconfig", "context", "cluster"], "line": line(active),
                               "rule": "replace when the kubeconfig's active cluster (its server and certificate) "
                                       "differs; the engine then replaces every resource the provider manages"},
            "delete_before_replace": {"explicit": False, "autonamed": []}}


def command_facts(tree: Tree) -> dict[str, Any]:
    path = "provider/pkg/provider/common/inputs.go"
    text = tree.read(path)
    paths, line = [], 0
    for m in re.finditer(r'^\s*\w+\s+[^`\n]+`pulumi:"(\w+),?[^"]*"\s+provider:"replaceOnChanges"`', text, re.M):
        paths.append(m.group(1))
        line = text.count("\n", 0, m.start()) + 1
    return {"provider": "pulumi-command", "force_new": [{"path": p, "kind": "list"} for p in paths], "file": path,
            "line": line, "note": "ResourceInputs tags `provider:\"replaceOnChanges\"`; the SDK also passes "
                                  "replace_on_changes=['triggers[*]']. Any other input change is an update, which runs "
                                  "`update` or, if unset, `create` again (local/commandController.go Update).",
            "delete_before_replace": {"explicit": False, "autonamed": []}}


DYNAMIC_FACT = {
    "provider": "dynamic",
    "note": "A Pulumi dynamic resource decides its own replacement: plan_change calls the resource's provider `diff` "
            "(components/cache_provider.py CacheDiskProvider.diff, CacheBucketProvider.diff) on the inputs, as "
            "the Python dynamic provider host does (pulumi/dynamic/__main__.py Diff). The host returns no detailed "
            "diff and no changed keys.",
}


def declared_types() -> list[str]:
    """Every custom resource type the stacks declare, from running them under mocks (tests/components/test_changes.py)."""
    sys.path.insert(0, str(ROOT))
    from tests.fakes.config_changes import declared_resource_types

    return sorted(declared_resource_types())


def derive(trees: dict[str, Tree], types: list[str]) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    cache: dict[Any, Any] = {}
    kubernetes = [t for t in types if t.startswith("kubernetes:") and not t.startswith("pulumi:")]
    resources.update(kubernetes_facts(trees["pulumi-kubernetes"], kubernetes))
    for token in types:
        prefix = token.split(":", 1)[0]
        if prefix in BRIDGED:
            resources[token] = bridged_resource(trees, prefix, token, cache)
        elif token == "command:local:Command":
            resources[token] = command_facts(trees["pulumi-command"])
        elif token == "pulumi-python:dynamic:Resource":
            resources[token] = DYNAMIC_FACT
        elif token == "pulumi:providers:kubernetes":
            resources[token] = kubernetes_provider_facts(trees["pulumi-kubernetes"])
        elif token not in resources:
            raise SourceError(f"{token}: no source known for this type")
    sources = {key: {"repo": pin.repo, "tag": pin.tag, "commit": trees[key].commit or pin.rev,
                     **({"note": pin.note} if pin.note else {})} for key, pin in PINS.items()}
    return {
        "about": "Generated by scripts/provider_facts.py from the providers' source; do not edit by hand. Paths are "
                 "Pulumi input paths ([*] = any list element); file and line are in the source of `provider`.",
        "sources": sources,
        "rules": {
            "force_new": "terraform-plugin-sdk v2.40.1 helper/schema/schema.go: a ForceNew attribute that changes "
                         "requires a new resource (finalizeDiff); a ForceNew list/set/map forces it when its element "
                         "count changes (countSchema) and, for primitive elements, when an element changes; nested "
                         "attributes of a block follow their own ForceNew. An Optional+Computed attribute removed "
                         "from the inputs keeps its old value: no diff (finalizeDiff, diffList, diffMap).",
            "detailed_diff": "pulumi-terraform-bridge pkg/tfbridge/detailed_diff.go and property_path.go "
                             "propertyPathTriggersReplacement: a changed path is shown as a replace when it, or its "
                             "direct parent collection (list, set, map), is ForceNew; all replaces are demoted when "
                             "Terraform plans no replacement, and one is added (__meta) when it plans one none shows.",
            "delete_before_replace": "pulumi-terraform-bridge pkg/tfbridge/provider.go Diff: deleteBeforeReplace = "
                                     "the provider replaces AND (DeleteBeforeReplace in the resource info OR an "
                                     "auto-named input set explicitly: schema.go nameRequiresDeleteBeforeReplace). "
                                     "A replacement forced only by replaceOnChanges keeps the provider's answer "
                                     "(false): pulumi/pulumi pkg/resource/deploy/step_generator.go "
                                     "applyReplaceOnChanges copies DeleteBeforeReplace through, and the resource "
                                     "option overrides it.",
            "replace_on_changes": "pulumi/pulumi step_generator.go applyReplaceOnChanges: each option path is parsed "
                                  "as a property path and marks every detailed-diff path it Contains "
                                  "(sdk/go/common/resource/properties_path.go: element-wise prefix match, `*` matches "
                                  "any one key or index; there is no `**`) as a replace.",
        },
        "resources": dict(sorted(resources.items())),
    }


def dump(value: Any, indent: str = "") -> str:
    """JSON with one line per flat object (a force-new path, a call): the file stays readable and diffs stay small."""
    flat = lambda v: not isinstance(v, (dict, list)) or (isinstance(v, list) and all(  # noqa: E731
        not isinstance(x, (dict, list)) for x in v))
    if isinstance(value, dict) and value and not all(flat(v) for v in value.values()):
        inner = indent + " "
        items = [f"{inner}{json.dumps(k)}: {dump(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, list) and value and not all(flat(v) for v in value):
        inner = indent + " "
        return "[\n" + ",\n".join(inner + dump(v, inner) for v in value) + "\n" + indent + "]"
    return json.dumps(value, ensure_ascii=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", type=Path, help="a folder holding one clone per pinned repository, by name")
    parser.add_argument("--fetch", type=Path, metavar="DIR", help="clone each pinned commit into DIR (network)")
    for key in PINS:
        parser.add_argument(f"--{key}", type=Path, help=f"git clone or dir of {PINS[key].repo}")
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed JSON differs")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.fetch:
        args.fetch.mkdir(parents=True, exist_ok=True)
        for pin in PINS.values():
            if not (args.fetch / pin.dirname).exists():
                for command in pin.fetch_commands(args.fetch):
                    subprocess.run(command, check=True)
        print(f"fetched the pinned sources into {args.fetch}; now --sources {args.fetch}")
        return 0
    trees = {}
    for key, pin in PINS.items():
        path = getattr(args, key.replace("-", "_")) or (args.sources / pin.dirname if args.sources else None)
        if path is None or not path.exists():
            print(f"{key}: no source at {path}; pass --sources DIR (see --fetch) or --{key} <clone of {pin.repo} "
                  f"holding {pin.rev}>", file=sys.stderr)
            return 2
        trees[key] = path
    try:
        trees = {key: Tree(path, PINS[key].rev) for key, path in trees.items()}
        facts = derive(trees, declared_types())
    except SourceError as err:
        print(f"provider_facts: {err}", file=sys.stderr)
        return 1
    text = dump(facts) + "\n"
    if args.check:
        same = args.out.exists() and args.out.read_text() == text
        print(f"{args.out}: {'up to date' if same else 'differs from the source; rerun without --check'}")
        return 0 if same else 1
    args.out.write_text(text)
    print(f"wrote {args.out}: {len(facts['resources'])} resource types")
    return 0


if __name__ == "__main__":
    sys.exit(main())
