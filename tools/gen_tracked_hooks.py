#!/usr/bin/env python3
"""Generates the access-tracking hooks of every cuDNN, cuBLAS and cuBLASLt function that can take a
device pointer: interpose/generated/tracked_{cudnn,cublas,cublaslt}.cpp.

Under VCUDNN_POLICY=offload a buffer may be on the host when a library call names it; each hook
reports its arguments to memory::touch (interpose/tracked_hook.h) before forwarding, so that the
buffer is brought back first. The generated files are committed; regenerate them after a cuDNN or
CUDA upgrade, from the repository root, with

    python3 tools/gen_tracked_hooks.py [--include /usr/local/cuda/include] [--lib DIR]

(stdlib only; needs `nm` from binutils). CMake never runs it to write; `--check` (a CPU test) fails
when the committed files differ from what it would write, and exits 77 (skipped) when the headers,
libraries or `nm` are missing.

Selection, from the prototypes in the installed headers:
  cuDNN    (cudnn_graph.h, cudnn_ops.h, cudnn_cnn.h, cudnn_adv.h): functions returning cudnnStatus_t
           with a `void *` or `const void *` parameter;
  cuBLAS   (cublas_api.h, as cublas_v2.h includes it): functions returning cublasStatus_t with a
           pointer parameter other than a cublasHandle_t *;
  cuBLASLt (cublasLt.h): functions returning cublasStatus_t with a `void *`/`const void *` parameter;
less the functions hooked by hand, read from the sources themselves (no list to keep in step):
runtime/cudnn_api.def's rows and every function returning cudnnStatus_t or cublasStatus_t
defined in interpose/*.cpp (library_hooks.cpp: those that keep pointers beyond the call), and
less names the real library does not export (`nm -D --defined-only`): a hook for a function the
library lacks could only fail.
"""

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# library: (headers, status type, Library enumerator, library file the names are checked in, output)
LIBRARIES = {
    "cudnn": (["cudnn_graph.h", "cudnn_ops.h", "cudnn_cnn.h", "cudnn_adv.h"], "cudnnStatus_t", "kCudnn",
              "libcudnn.so.9", "tracked_cudnn.cpp"),
    "cublas": (["cublas_api.h"], "cublasStatus_t", "kCublas", "libcublas.so.13", "tracked_cublas.cpp"),
    "cublaslt": (["cublasLt.h"], "cublasStatus_t", "kCublasLt", "libcublasLt.so.13", "tracked_cublaslt.cpp"),
}


class Param:
    def __init__(self, text, index):
        text = " ".join(text.split())
        self.is_array = text.endswith("]")
        decl = re.sub(r"\s*\[[^\]]*\]$", "", text)
        m = re.search(r"([A-Za-z_]\w*)$", decl)
        if not m or m.group(1) in ("void", "int", "float", "double", "char") or m.group(1).endswith("_t"):
            raise ValueError(f"unnamed parameter {text!r} (#{index})")
        self.name = m.group(1)
        self.type = decl[: m.start()].strip() + ("*" if self.is_array else "")
        self.text = text

    def bare_type(self):
        """The type without qualifiers or spaces: 'const void *' -> 'void*'."""
        return re.sub(r"\bconst\b|\s", "", self.type)

    def is_pointer(self):
        return "*" in self.type


class Function:
    def __init__(self, status, name, params):
        self.status = status
        self.name = name
        self.params = params
        self.overloaded = False

    def signature(self):
        head = f"{self.status} {self.name}("
        one_line = head + ", ".join(p.text for p in self.params) + ") {"
        if len(one_line) <= 120:
            return one_line
        indent = " " * len(head)
        return head + (",\n" + indent).join(p.text for p in self.params) + ") {"


def strip_source(text):
    """Header text without comments and preprocessor lines (every #if branch kept: C++ sees them)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r"\\\n", " ", text)
    return "\n".join(line for line in text.split("\n") if not line.lstrip().startswith("#"))


def parse_header(path, status):
    """Declarations (ending in ';', so no static inline bodies) returning `status`; `overloaded`
    is set where the header also defines a C++ overload of the name (static inline)."""
    text = strip_source(open(path, encoding="utf-8").read())
    overloads = set(re.findall(r"\bstatic\s+inline\s+" + status + r"\s+([A-Za-z_]\w*)\s*\(", text))
    decl = re.compile(r"\b" + status + r"\s+(?:CUDNNWINAPI\s+|CUBLASWINAPI\s+)?([A-Za-z_]\w*)\s*\(([^;{}()]*)\)\s*;")
    functions = []
    for m in decl.finditer(text):
        raw = m.group(2).strip()
        parts = [] if raw in ("", "void") else [p.strip() for p in raw.split(",")]
        functions.append(Function(status, m.group(1), [Param(p, i) for i, p in enumerate(parts)]))
        functions[-1].overloaded = m.group(1) in overloads
    return functions


def exported_names(lib_dir, soname):
    path = os.path.join(lib_dir, soname)
    out = subprocess.run(["nm", "-D", "--defined-only", path], check=True, capture_output=True, text=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if len(line.split()) >= 3}


def hand_written():
    """The library functions vcudnn defines by hand: runtime/cudnn_api.def's rows (the cuDNN hooks
    and the convolution family, expanded by macros) and the definitions, at the start of a line,
    of functions returning a cuDNN or cuBLAS status in interpose/*.cpp."""
    text = open(os.path.join(REPO, "runtime", "cudnn_api.def"), encoding="utf-8").read()
    names = set(re.findall(r"^VCUDNN_CUDNN_(?:HOOK|CONV_ROW)\(\s*\w+\s*,\s*(\w+)", text, flags=re.M))
    folder = os.path.join(REPO, "interpose")
    for name in sorted(os.listdir(folder)):
        if name.endswith(".cpp"):
            source = strip_source(open(os.path.join(folder, name), encoding="utf-8").read())
            names |= set(re.findall(r"^(?:cudnnStatus_t|cublasStatus_t)\s+(\w+)\s*\([^;]*?\)\s*\{", source,
                                    flags=re.M | re.S))
    return names


def v2_macros(include_dir):
    """Names cublas_v2.h redefines as macros: a hook under such a name would be renamed."""
    text = open(os.path.join(include_dir, "cublas_v2.h"), encoding="utf-8").read()
    return set(re.findall(r"^\s*#\s*define\s+(\w+)\s+\w+", text, flags=re.M))


def selected(lib, fn):
    if lib == "cublas":
        return any(p.is_pointer() and p.bare_type() != "cublasHandle_t*" for p in fn.params)
    return any(p.bare_type() == "void*" for p in fn.params)


def version(include_dir, lib):
    if lib == "cudnn":
        text = open(os.path.join(include_dir, "cudnn_version.h"), encoding="utf-8").read()
        keys = ("CUDNN_MAJOR", "CUDNN_MINOR", "CUDNN_PATCHLEVEL")
        name = "cuDNN"
    else:
        text = open(os.path.join(include_dir, "cublas_api.h"), encoding="utf-8").read()
        keys = ("CUBLAS_VER_MAJOR", "CUBLAS_VER_MINOR", "CUBLAS_VER_PATCH")
        name = "cuBLAS"
    parts = [re.search(r"#define\s+" + k + r"\s+(\d+)", text).group(1) for k in keys]
    return f"{name} {'.'.join(parts)}"


def wrap(items, indent, width=118):
    """items joined by ', ', broken into lines of at most `width` columns, each indented."""
    lines, line = [], ""
    for item in items:
        if line and indent + len(line) + len(item) + 2 > width:
            lines.append(line + ",")
            line = ""
        line += (", " if line else "") + item
    lines.append(line)
    return "\n".join(" " * indent + l for l in lines)


def render(lib, functions, headers, soname, enumerator, status):
    include = {"cudnn": "<cudnn.h>", "cublas": "<cublas_v2.h>", "cublaslt": "<cublasLt.h>"}[lib]
    lines = [
        "// Generated by tools/gen_tracked_hooks.py: do not edit, rerun `python3 tools/gen_tracked_hooks.py`.",
        f"// From {', '.join(headers)} (no version or path here: the file is the same wherever the",
        "// toolkit has the same functions; --check prints both),",
        f"// checked against the names {soname} exports: {len(functions)} functions returning {status} that",
        "// can take a device pointer. Each reports its arguments to memory::touch, then forwards",
        "// (interpose/tracked_hook.h).",
        f"#include {include}",
        "",
        '#include "interpose/tracked_hook.h"',
        "",
        "// The headers mark many of these functions deprecated; they are still exported, so still hooked.",
        '#pragma GCC diagnostic ignored "-Wdeprecated-declarations"',
        "",
        "#pragma GCC visibility push(default)",
        'extern "C" {',
        "",
    ]
    for fn in functions:
        args = "".join(", " + p.name for p in fn.params)
        lines.append(fn.signature())
        if fn.overloaded:
            # The header adds C++ overloads of this name: the hook names its own type.
            types = wrap([p.type for p in fn.params], 35)
            body = (f"  return VCUDNN_TRACKED_OVERLOADED({enumerator}, {fn.name},\n{' ' * 34}({types.lstrip()}),\n"
                    + wrap([p.name for p in fn.params], 34) + ");")
        else:
            body = f"  return VCUDNN_TRACKED({enumerator}, {fn.name}{args});"
            if len(body) > 120:
                names = wrap([p.name for p in fn.params], 24)
                body = f"  return VCUDNN_TRACKED({enumerator}, {fn.name},\n{names});"
        lines += [body, "}", ""]
    lines += ['}  // extern "C"', "#pragma GCC visibility pop", ""]
    return "\n".join(lines)


def find_lib_dir(include_dir, check=False):
    root = os.path.dirname(os.path.abspath(include_dir))
    for sub in ("lib64", "lib", "targets/x86_64-linux/lib"):
        if os.path.exists(os.path.join(root, sub, "libcudnn.so.9")):
            return os.path.join(root, sub)
    if check:
        print(f"skipped: libcudnn.so.9 not found under {root}")
        sys.exit(77)
    sys.exit(f"libcudnn.so.9 not found under {root}: pass --lib")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--include", default="/usr/local/cuda/include", help="folder with cudnn*.h, cublas*.h")
    ap.add_argument("--lib", help="folder with libcudnn.so.9, libcublas.so.13, libcublasLt.so.13")
    ap.add_argument("--out", default=os.path.join(REPO, "interpose", "generated"))
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if the files in --out differ from what would be written")
    args = ap.parse_args()
    if args.check:
        missing = [h for lib in LIBRARIES.values() for h in lib[0] if not os.path.exists(os.path.join(args.include, h))]
        if missing or shutil.which("nm") is None:
            print(f"skipped: {'missing headers ' + ', '.join(missing) if missing else 'no nm'}")
            sys.exit(77)
    lib_dir = args.lib or find_lib_dir(args.include, args.check)
    absent = [lib[3] for lib in LIBRARIES.values() if not os.path.exists(os.path.join(lib_dir, lib[3]))]
    if absent:
        if args.check:
            print(f"skipped: {', '.join(absent)} not in {lib_dir}")
            sys.exit(77)
        sys.exit(f"{', '.join(absent)} not in {lib_dir}: pass --lib")
    skip = hand_written()
    stale = []
    macros = v2_macros(args.include)
    for lib, (headers, status, enumerator, soname, out_name) in LIBRARIES.items():
        declared = {}
        for h in headers:
            for fn in parse_header(os.path.join(args.include, h), status):
                declared.setdefault(fn.name, fn)
        exported = exported_names(lib_dir, soname)
        candidates = [fn for fn in declared.values() if selected(lib, fn) and fn.name not in skip]
        functions = sorted((fn for fn in candidates if fn.name in exported), key=lambda f: f.name)
        missing = sorted(fn.name for fn in candidates if fn.name not in exported)
        renamed = [fn.name for fn in functions if fn.name in macros]
        if renamed:
            sys.exit(f"{lib}: cublas_v2.h renames {renamed}: the hooks would be misnamed")
        text = render(lib, functions, headers, soname, enumerator, status)
        path = os.path.join(args.out, out_name)
        if args.check:
            old = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
            if old != text:
                stale.append(out_name)
                diff = list(difflib.unified_diff(old.splitlines(), text.splitlines(), path, "generated", lineterm=""))
                print("\n".join(diff[:40]) + ("\n..." if len(diff) > 40 else ""))
        else:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        print(f"{out_name}: {len(functions)} hooks from {version(args.include, lib)} in {args.include}"
              f" ({len(missing)} declared but not exported by {soname}"
              + (f": {', '.join(missing)}" if missing else "") + ")")
    if stale:
        sys.exit(f"out of date: {', '.join(stale)} (the hand-written hooks, the headers or the libraries changed): "
                 "rerun python3 tools/gen_tracked_hooks.py")


if __name__ == "__main__":
    main()
