"""What a compiled extension module is and what it needs, read from the file alone.

Reads the three formats the wheels ship (ELF for Linux, Mach-O for macOS, PE for Windows)
without running the binary and without binutils, so that a wheel for a platform this machine
cannot run can still be checked here: its architecture, the symbols it exports, the libraries
it loads and the symbols it takes from each.

Only what the wheel checks need is parsed: 64-bit little-endian files (x86_64 and aarch64;
Mach-O universal files are split into their slices).

    python scripts/native_binary.py FILE    # prints what was read, as JSON
"""

from __future__ import annotations

import json
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

# Architecture names as wheel tags spell them on Linux (the checks normalise every tag to these).
X86_64 = "x86_64"
AARCH64 = "aarch64"


class FormatError(ValueError):
    """The file is not a binary this module can read (or is truncated)."""


@dataclass
class NativeBinary:
    """What one binary (one slice of a universal Mach-O) is and needs."""

    format: str
    """``ELF``, ``Mach-O`` or ``PE``."""
    arch: str
    """``x86_64`` or ``aarch64``, or the raw machine number when it is neither."""
    kind: str
    """``shared library`` when the file can be loaded as a module, else what it is."""
    libraries: list[str] = field(default_factory=list)
    """Libraries loaded with it, in order: ``DT_NEEDED``, ``LC_LOAD_DYLIB`` paths, or DLL names."""
    exports: set[str] = field(default_factory=set)
    """Symbols it defines for others (Mach-O's leading underscore removed)."""
    imports: dict[str, set[str]] = field(default_factory=dict)
    """Symbols taken from each library. PE and Mach-O (two-level namespace) bind each import to
    one library. ELF does not: its undefined symbols are all under the key ``""``, as are Mach-O
    symbols looked up in every loaded image (``-undefined dynamic_lookup``)."""
    weak: set[str] = field(default_factory=set)
    """Imports that may be missing at run time (weak references), a subset of the imports."""
    symbol_versions: dict[str, set[str]] = field(default_factory=dict)
    """ELF only: the symbol versions needed from each library (e.g. ``GLIBC_2.17``)."""
    min_os: tuple[int, ...] | None = None
    """Mach-O only: the oldest macOS it declares it runs on."""

    def all_imports(self) -> set[str]:
        """Every imported symbol, whatever library it comes from."""
        return set().union(*self.imports.values()) if self.imports else set()


def read(path: Path) -> list[NativeBinary]:
    """Every binary in ``path`` (one, or one per slice of a universal Mach-O)."""
    data = path.read_bytes()
    try:
        if data[:4] == b"\x7fELF":
            return [_elf(data)]
        if data[:4] in (b"\xcf\xfa\xed\xfe", b"\xca\xfe\xba\xbe"):
            return _macho(data)
        if data[:2] == b"MZ":
            return [_pe(data)]
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise FormatError(f"{path.name}: truncated or malformed ({exc})") from exc
    raise FormatError(f"{path.name}: not an ELF, Mach-O or PE file (starts with {data[:4].hex()})")


def _cstr(data: bytes, offset: int) -> str:
    end = data.index(b"\0", offset)
    return data[offset:end].decode()


# --- ELF ---------------------------------------------------------------------------------------
_ELF_MACHINES = {62: X86_64, 183: AARCH64}
_SHT_DYNAMIC, _SHT_DYNSYM, _SHT_VERNEED = 6, 11, 0x6FFFFFFE
_DT_NEEDED = 1
_STB_WEAK = 2
_SHN_UNDEF = 0


def _elf(data: bytes) -> NativeBinary:
    if data[4] != 2 or data[5] != 1:
        raise FormatError("only 64-bit little-endian ELF is read")
    e_type, e_machine = struct.unpack_from("<HH", data, 16)
    (e_shoff,) = struct.unpack_from("<Q", data, 40)
    e_shentsize, e_shnum = struct.unpack_from("<HH", data, 58)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize) for i in range(e_shnum)]

    def strtab(index: int) -> tuple[int, int]:
        sh = sections[index]
        return sh[4], sh[5]  # offset, size

    out = NativeBinary("ELF", _ELF_MACHINES.get(e_machine, str(e_machine)), "shared library" if e_type == 3 else f"ELF type {e_type}")
    for sh in sections:
        sh_type, sh_offset, sh_size, sh_link, sh_info = sh[1], sh[4], sh[5], sh[6], sh[7]
        if sh_type == _SHT_DYNAMIC:
            names, _ = strtab(sh_link)
            for pos in range(sh_offset, sh_offset + sh_size, 16):
                tag, val = struct.unpack_from("<qQ", data, pos)
                if tag == 0:
                    break
                if tag == _DT_NEEDED:
                    out.libraries.append(_cstr(data, names + val))
        elif sh_type == _SHT_DYNSYM:
            names, _ = strtab(sh_link)
            for pos in range(sh_offset + 24, sh_offset + sh_size, 24):  # entry 0 is the null symbol
                st_name, st_info, _other, st_shndx = struct.unpack_from("<IBBH", data, pos)
                name = _cstr(data, names + st_name)
                if not name or (st_info >> 4) == 0:  # local
                    continue
                if st_shndx == _SHN_UNDEF:
                    out.imports.setdefault("", set()).add(name)
                    if st_info >> 4 == _STB_WEAK:
                        out.weak.add(name)
                else:
                    out.exports.add(name)
        elif sh_type == _SHT_VERNEED:
            names, _ = strtab(sh_link)
            pos = sh_offset
            for _ in range(sh_info):
                _ver, count, file_off, aux, nxt = struct.unpack_from("<HHIII", data, pos)
                versions = out.symbol_versions.setdefault(_cstr(data, names + file_off), set())
                apos = pos + aux
                for _ in range(count):
                    _hash, _flags, _other, name_off, anext = struct.unpack_from("<IHHII", data, apos)
                    versions.add(_cstr(data, names + name_off))
                    apos += anext
                pos += nxt
    return out


# --- Mach-O ------------------------------------------------------------------------------------
_MACHO_CPUS = {0x01000007: X86_64, 0x0100000C: AARCH64}
_MH_DYLIB, _MH_BUNDLE = 6, 8
_MH_TWOLEVEL = 0x80
_LC_SYMTAB = 0x2
_LC_LOAD_DYLIBS = {0xC, 0x80000018, 0x8000001F, 0x20, 0x80000023}  # load, weak, reexport, lazy, upward
_LC_DYLD_INFO, _LC_DYLD_INFO_ONLY, _LC_DYLD_EXPORTS_TRIE = 0x22, 0x80000022, 0x80000033
_LC_VERSION_MIN_MACOSX = 0x24
_LC_BUILD_VERSION = 0x32
_N_STAB, _N_PEXT, _N_TYPE, _N_EXT, _N_UNDF = 0xE0, 0x10, 0x0E, 0x01, 0x0
_N_WEAK_REF = 0x40
_DYNAMIC_LOOKUP_ORDINAL = 0xFE


def _macho(data: bytes) -> list[NativeBinary]:
    if data[:4] == b"\xca\xfe\xba\xbe":  # universal: big-endian table of slices
        (count,) = struct.unpack_from(">I", data, 4)
        slices = []
        for i in range(count):
            _cpu, _sub, offset, size, _align = struct.unpack_from(">IIIII", data, 8 + i * 20)
            slices.extend(_macho(data[offset : offset + size]))
        return slices
    _magic, cpu, _sub, filetype, ncmds, _size, flags, _reserved = struct.unpack_from("<IiiIIIII", data, 0)
    kind = "shared library" if filetype in (_MH_DYLIB, _MH_BUNDLE) else f"Mach-O file type {filetype}"
    out = NativeBinary("Mach-O", _MACHO_CPUS.get(cpu, str(cpu)), kind)
    symtab = None
    trie = None
    pos = 32
    for _ in range(ncmds):
        cmd, cmdsize = struct.unpack_from("<II", data, pos)
        if cmd in _LC_LOAD_DYLIBS:
            (name_off,) = struct.unpack_from("<I", data, pos + 8)
            out.libraries.append(_cstr(data, pos + name_off))
        elif cmd == _LC_SYMTAB:
            symtab = struct.unpack_from("<IIII", data, pos + 8)
        elif cmd in (_LC_DYLD_INFO, _LC_DYLD_INFO_ONLY):
            trie = struct.unpack_from("<II", data, pos + 40)
        elif cmd == _LC_DYLD_EXPORTS_TRIE:
            trie = struct.unpack_from("<II", data, pos + 8)
        elif cmd == _LC_BUILD_VERSION:
            _platform, minos = struct.unpack_from("<II", data, pos + 8)
            out.min_os = (minos >> 16, (minos >> 8) & 0xFF, minos & 0xFF)
        elif cmd == _LC_VERSION_MIN_MACOSX and out.min_os is None:
            (version,) = struct.unpack_from("<I", data, pos + 8)
            out.min_os = (version >> 16, (version >> 8) & 0xFF, version & 0xFF)
        pos += cmdsize
    if trie and trie[1]:
        # What dyld exports is the export trie; the symbol table may list more as external.
        out.exports = _export_trie(data, trie[0], trie[0] + trie[1])
        exports_from_symtab = False
    else:
        exports_from_symtab = True
    if symtab is None:
        return [out]
    symoff, nsyms, stroff, _strsize = symtab
    twolevel = bool(flags & _MH_TWOLEVEL)
    for i in range(nsyms):
        n_strx, n_type, _sect, n_desc, _value = struct.unpack_from("<IBBHQ", data, symoff + 16 * i)
        if n_type & _N_STAB or not n_type & _N_EXT:
            continue
        name = _cstr(data, stroff + n_strx).removeprefix("_")
        if n_type & _N_TYPE != _N_UNDF:
            if exports_from_symtab and not n_type & _N_PEXT:  # private extern: image-local
                out.exports.add(name)
            continue
        ordinal = (n_desc >> 8) & 0xFF
        if twolevel and 1 <= ordinal <= len(out.libraries):
            library = out.libraries[ordinal - 1]
        else:  # flat lookup (dynamic_lookup), or not two-level at all
            library = ""
        out.imports.setdefault(library, set()).add(name)
        if n_desc & _N_WEAK_REF:
            out.weak.add(name)
    return [out]


def _uleb(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def _export_trie(data: bytes, start: int, end: int) -> set[str]:
    """Names in a Mach-O export trie (a prefix tree of the exported symbols)."""
    names: set[str] = set()
    todo = [(start, b"")]
    seen = set()
    while todo:
        node, prefix = todo.pop()
        if node in seen or not start <= node < end:
            raise FormatError("malformed export trie")
        seen.add(node)
        terminal, pos = _uleb(data, node)
        if terminal:
            names.add(prefix.decode().removeprefix("_"))
        pos += terminal
        children = data[pos]
        pos += 1
        for _ in range(children):
            edge_end = data.index(b"\0", pos)
            edge = data[pos:edge_end]
            child, pos = _uleb(data, edge_end + 1)
            todo.append((start + child, prefix + edge))
    return names


# --- PE ----------------------------------------------------------------------------------------
_PE_MACHINES = {0x8664: X86_64, 0xAA64: AARCH64}
_IMAGE_FILE_DLL = 0x2000


def _pe(data: bytes) -> NativeBinary:
    (pe_off,) = struct.unpack_from("<I", data, 0x3C)
    if data[pe_off : pe_off + 4] != b"PE\0\0":
        raise FormatError("MZ file without a PE header")
    machine, nsections, _ts, _symptr, _nsyms, opt_size, characteristics = struct.unpack_from("<HHIIIHH", data, pe_off + 4)
    opt = pe_off + 24
    (magic,) = struct.unpack_from("<H", data, opt)
    if magic != 0x20B:
        raise FormatError("only PE32+ (64-bit) is read")
    (ndirs,) = struct.unpack_from("<I", data, opt + 108)
    dirs = [struct.unpack_from("<II", data, opt + 112 + 8 * i) for i in range(min(ndirs, 16))]
    sections = []
    for i in range(nsections):
        vsize, vaddr, rawsize, rawptr = struct.unpack_from("<IIII", data, opt + opt_size + 40 * i + 8)
        sections.append((vaddr, max(vsize, rawsize), rawptr))

    def off(rva: int) -> int:
        for vaddr, size, rawptr in sections:
            if vaddr <= rva < vaddr + size:
                return rva - vaddr + rawptr
        raise FormatError(f"RVA {rva:#x} is in no section")

    kind = "shared library" if characteristics & _IMAGE_FILE_DLL else "PE executable"
    out = NativeBinary("PE", _PE_MACHINES.get(machine, hex(machine)), kind)

    def thunks(dll: str, table_rva: int) -> None:
        symbols = out.imports.setdefault(dll, set())
        pos = off(table_rva)
        while True:
            (entry,) = struct.unpack_from("<Q", data, pos)
            if entry == 0:
                break
            if entry >> 63:
                symbols.add(f"#{entry & 0xFFFF}")  # by ordinal
            else:
                symbols.add(_cstr(data, off(entry & 0x7FFFFFFF) + 2))  # skip the hint
            pos += 8

    if len(dirs) > 0 and dirs[0][0]:  # export directory
        exp = off(dirs[0][0])
        count, names_rva = struct.unpack_from("<I4xI", data, exp + 24)
        for i in range(count):
            (name_rva,) = struct.unpack_from("<I", data, off(names_rva) + 4 * i)
            out.exports.add(_cstr(data, off(name_rva)))
    # The import directory, and delay-load imports (loaded on first use, still needed): per
    # directory, its descriptor size, which of the descriptor's first five fields names the DLL,
    # and which hold the table of names (the first non-zero one).
    for index, size, name_at, tables in ((1, 20, 3, (0, 4)), (13, 32, 1, (4,))):
        if len(dirs) <= index or not dirs[index][0]:
            continue
        pos = off(dirs[index][0])
        while True:
            fields = struct.unpack_from("<IIIII", data, pos)
            if fields[name_at] == 0:
                break
            dll = _cstr(data, off(fields[name_at]))
            out.libraries.append(dll)
            thunks(dll, next((fields[i] for i in tables if fields[i]), 0))
            pos += size
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    for binary in read(Path(argv[0])):
        shown = {k: sorted(v) if isinstance(v, set) else v for k, v in vars(binary).items()}
        shown["imports"] = {k: sorted(v) for k, v in binary.imports.items()}
        shown["symbol_versions"] = {k: sorted(v) for k, v in binary.symbol_versions.items()}
        print(json.dumps(shown, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
