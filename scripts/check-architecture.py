#!/usr/bin/env python3
"""Prints qxfer's target graph and fails on an edge the architecture forbids (docs/ARCHITECTURE.md).

Reads the manifest (`swift package dump-package`, no build) and every source file's imports:
  - no dependency cycle between targets;
  - the library's layers depend only downwards: QXferCore (no sockets, no C, no stack) ←
    QXferIdentity ← QXferSockets ← the stacks (QXferTLS, QXferQUIC, QXferRace) and QXferDiscovery ← QXfer;
    a stack never depends on another stack;
  - QUICEngine is sans-IO: no NIO, nothing of the library above it;
  - applications (transfer, streaming, pairing, the CLI, samples, bench) reach no C module and
    no engine, and see the library only through the umbrella `QXfer`;
  - a source file imports only modules its target declares (SwiftPM lets a file import any
    module already built), and only the library's layers and tests use `@_spi(Stacks)`;
  - inside QXferQUIC, arrows point down: Connect → Adaptor → Driver → Endpoint, never back;
  - the library and the tool (everything under Sources/) import FoundationEssentials, never
    all of Foundation, which the tool would link (docs/benchmarks.md, "Process start without
    Foundation"); samples, benchmarks, fuzzers and tests may.
Exit status 1 with one line per violation.
"""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

C_MODULES = {"CNGTCP2", "CQUICPacketProtection", "CQXferLinux", "CP256", "CXXHash", "CFileSystemLinux"}
ENGINE = "QUICEngine"
# The library's layers, lowest first; a layer depends only on lower ones.
LAYERS = {
    "QXferCore": 0,
    "QXferIdentity": 1,
    "QXferSockets": 2,
    "QXferTLS": 3, "QXferQUIC": 3, "QXferDiscovery": 3,
    # A stack built from others knows them only through the seam, so it sits beside them.
    "QXferRace": 3,
    "QXfer": 4,
}
# Swift wrappers that keep a C module (or Glibc work) away from the applications.
WRAPPERS = {"SafeOutput", "PairingGroup", "LinuxSystem", "FastHash"}
# What the core API may use of NIO: the I/O-free buffer and lock types, never sockets or TLS.
CORE_PRODUCTS = {"NIOCore", "NIOConcurrencyHelpers", "NIOFoundationEssentialsCompat", "Crypto", "Logging"}
# Edges that other branches remove; each names where it goes.
KNOWN_EXCEPTIONS: dict = {}
# Inside a target, folders in layers, lowest first: a file names no type declared in a higher
# folder (the QUIC side as quinn shapes it; the target's top folder, the stack's description and
# its seam, may use them all).
FOLDER_ORDER = {
    "QXferQUIC": ["Endpoint", "Driver", "Adaptor", "Connect"],
}
SYSTEM_MODULES = {"Foundation", "FoundationEssentials", "Glibc", "Darwin", "Dispatch", "Synchronization",
                  "Testing", "XCTest", "_Concurrency", "Observation", "os", "Musl"}
IMPORT = re.compile(r"^(?:@[\w()]+\s+)*(?:@testable\s+)?(?:(?:internal|public|package|private|fileprivate)\s+)?"
                    r"import\s+(?:(?:struct|class|enum|protocol|func|var|let|typealias)\s+)?([A-Za-z_][\w]*)")


def manifest():
    out = subprocess.run(["swift", "package", "dump-package"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def dependencies(target):
    """(targets, products) a target declares."""
    targets, products = [], []
    for dep in target["dependencies"]:
        if "byName" in dep:
            targets.append(dep["byName"][0])
        elif "target" in dep:
            targets.append(dep["target"][0])
        elif "product" in dep:
            products.append(dep["product"][0])
    return targets, products


def source_folder(target):
    if target.get("path"):
        return os.path.join(ROOT, target["path"])
    base = "Tests" if target["type"] == "test" else "Sources"
    return os.path.join(ROOT, base, target["name"])


def imports(folder, exclude):
    """(file, module, line) for every import in the folder's Swift files."""
    for directory, subdirectories, files in os.walk(folder):
        subdirectories[:] = [d for d in subdirectories if os.path.join(directory, d) not in exclude]
        for name in sorted(files):
            if not name.endswith(".swift"):
                continue
            path = os.path.join(directory, name)
            with open(path, encoding="utf-8") as file:
                for line in file:
                    match = IMPORT.match(line)
                    if match:
                        yield os.path.relpath(path, ROOT), match.group(1), line.strip()


DECLARATION = re.compile(r"^\s*(?:(?:public|internal|private|fileprivate|package|final|@[\w()]+)\s+)*"
                         r"(?:class|struct|enum|protocol|actor|typealias)\s+(\w+)")


def code_of(path):
    """A Swift file without its comments and string literals (good enough to look for names)."""
    with open(path, encoding="utf-8") as file:
        text = file.read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)


def folder_order_problems(root, order):
    """Files of a lower folder that name a type declared in a higher one."""
    files = {folder: [os.path.join(directory, f) for directory, _, names in os.walk(os.path.join(root, folder))
                      for f in names if f.endswith(".swift")] for folder in order}
    declared = {folder: {m.group(1) for path in paths for line in open(path, encoding="utf-8")
                         for m in [DECLARATION.match(line)] if m} for folder, paths in files.items()}
    problems = []
    for index, folder in enumerate(order):
        # A name the folder declares itself (a protocol's associated type, such as a NIO
        # handler's `InboundIn`) is its own, whatever a higher folder also declares.
        higher = {name: other for other in order[index + 1:] for name in declared[other] if name not in declared[folder]}
        for path in files[folder]:
            code = code_of(path)
            for name, other in sorted(higher.items()):
                if re.search(r"\b" + re.escape(name) + r"\b", code):
                    problems.append(f"{os.path.relpath(path, ROOT)}: names {name} from {other}/, a higher layer than {folder}/")
    return problems


def find_cycle(graph):
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for next_node in graph.get(node, []):
            if state.get(next_node) == "open":
                return stack[stack.index(next_node):] + [next_node]
            if next_node not in state:
                cycle = visit(next_node)
                if cycle:
                    return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def main():
    package = manifest()
    targets = {t["name"]: t for t in package["targets"]}
    graph = {name: dependencies(t)[0] for name, t in targets.items()}
    problems = []

    print("Target graph (→ targets of this package; [products]):")
    for name in sorted(targets, key=lambda n: (targets[n]["type"] == "test", LAYERS.get(n, 9), n)):
        deps, products = dependencies(targets[name])
        line = f"  {name} → {', '.join(deps) or '∅'}"
        if products:
            line += f"  [{', '.join(products)}]"
        print(line)

    cycle = find_cycle(graph)
    if cycle:
        problems.append("dependency cycle: " + " → ".join(cycle))

    def forbid(source, dependency, why):
        if (source, dependency) in KNOWN_EXCEPTIONS:
            return
        problems.append(f"{source} → {dependency}: {why}")

    for name, target in targets.items():
        deps, products = dependencies(target)
        if target["type"] == "test":
            continue
        if name == "QXferCore":
            for product in products:
                if product not in CORE_PRODUCTS:
                    forbid(name, product, "the core API uses no sockets, TLS or C (only " + ", ".join(sorted(CORE_PRODUCTS)) + ")")
        if name == ENGINE:
            for dep in deps:
                if dep not in C_MODULES:
                    forbid(name, dep, "the QUIC engine is sans-IO and knows nothing above it")
            for product in products:
                forbid(name, product, "the QUIC engine is sans-IO: no NIO, no other package")
        if name in LAYERS:
            for dep in deps:
                if dep in LAYERS and LAYERS[dep] >= LAYERS[name]:
                    forbid(name, dep, "a layer depends only on lower layers (and a stack never on another stack)")
                if dep in C_MODULES and LAYERS[name] < 3:
                    forbid(name, dep, "below the stacks the library reaches no C module")
                if dep == ENGINE and name != "QXferQUIC":
                    forbid(name, dep, "only the QUIC stack drives the QUIC engine")
        elif name not in C_MODULES and name != ENGINE and name not in WRAPPERS:
            # An application: the CLI, transfer, streaming, pairing, samples, bench, tools.
            for dep in deps:
                if dep in C_MODULES:
                    forbid(name, dep, "applications reach C only through a Swift wrapper (" + ", ".join(sorted(WRAPPERS)) + ")")
                elif dep == ENGINE:
                    forbid(name, dep, "applications use the connection API, not the engine")
                elif dep in LAYERS and dep != "QXfer":
                    forbid(name, dep, "applications see the library through `import QXfer` only")

    # File level: what each file imports is declared, and the stacks' SPI stays in the library.
    folders = {name: source_folder(t) for name, t in targets.items()}
    for name, target in targets.items():
        deps, products = dependencies(target)
        allowed = set(deps) | set(products) | SYSTEM_MODULES | {name}
        if folders[name].startswith(os.path.join(ROOT, "Sources") + os.sep):
            allowed.discard("Foundation")
        nested = {folder for other, folder in folders.items() if other != name and folder.startswith(folders[name] + os.sep)}
        exclude = nested | {os.path.join(folders[name], e) for e in target.get("exclude", [])}
        for path, module, line in imports(folders[name], exclude):
            if module not in allowed:
                if (name, module) in KNOWN_EXCEPTIONS:
                    continue
                why = ("the tool links FoundationEssentials only" if module == "Foundation"
                       else f"which target {name} does not declare")
                problems.append(f"{path}: imports {module}, {why}")
            if "@_spi(" in line and name not in LAYERS and target["type"] != "test":
                problems.append(f"{path}: `{line}`: only the library's layers use its stacks' SPI")

    for name, order in FOLDER_ORDER.items():
        problems += folder_order_problems(folders[name], order)

    for (source, dependency), why in KNOWN_EXCEPTIONS.items():
        if dependency in graph.get(source, []):
            print(f"known exception: {source} → {dependency} ({why})")
    if problems:
        print("\nArchitecture check failed:", file=sys.stderr)
        for problem in problems:
            print("  " + problem, file=sys.stderr)
        return 1
    print("Architecture check passed: no cycle, no forbidden edge.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
