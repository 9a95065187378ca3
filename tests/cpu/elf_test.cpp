// libvcudnn.so's ELF dynamic section and symbol table, read with <elf.h>: only system libraries
// as DT_NEEDED, every hook exported, nothing defined outside the interposed libraries' prefixes
// and vcudnn*, no descriptor getters or creators.
#include <catch2/catch.hpp>

#include <elf.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "runtime/entry_points.h"
#include "tests/common/test_util.h"

namespace {

struct Symbol {
  std::string name;
  unsigned bind = 0;
  unsigned type = 0;
  unsigned visibility = 0;
  bool defined = false;
};

struct ElfInfo {
  std::vector<std::string> needed;
  std::vector<Symbol> dynsym;
};

template <typename T>
const T* at(const std::vector<char>& file, uint64_t offset, uint64_t count = 1) {
  REQUIRE(offset <= file.size());
  REQUIRE(count * sizeof(T) <= file.size() - offset);
  return reinterpret_cast<const T*>(file.data() + offset);
}

std::string cstr(const std::vector<char>& file, uint64_t table_offset, uint64_t table_size, uint64_t index) {
  REQUIRE(index < table_size);
  REQUIRE(table_offset + table_size <= file.size());
  const char* s = file.data() + table_offset + index;
  const size_t max = table_size - index;
  const size_t len = strnlen(s, max);
  REQUIRE(len < max);  // NUL-terminated inside the table
  return std::string(s, len);
}

ElfInfo read_elf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  const std::vector<char> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto* eh = at<Elf64_Ehdr>(file, 0);
  REQUIRE(std::memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0);
  REQUIRE(eh->e_ident[EI_CLASS] == ELFCLASS64);
  REQUIRE(eh->e_ident[EI_DATA] == ELFDATA2LSB);
  REQUIRE(eh->e_type == ET_DYN);
  REQUIRE(eh->e_phentsize == sizeof(Elf64_Phdr));
  REQUIRE(eh->e_shentsize == sizeof(Elf64_Shdr));

  ElfInfo info;
  const auto* ph = at<Elf64_Phdr>(file, eh->e_phoff, eh->e_phnum);
  // Virtual address -> file offset, through the PT_LOAD segments.
  auto file_offset = [&](uint64_t vaddr) -> uint64_t {
    for (int i = 0; i < eh->e_phnum; ++i)
      if (ph[i].p_type == PT_LOAD && vaddr >= ph[i].p_vaddr && vaddr < ph[i].p_vaddr + ph[i].p_filesz)
        return vaddr - ph[i].p_vaddr + ph[i].p_offset;
    FAIL("address " << vaddr << " is in no PT_LOAD segment");
    return 0;
  };

  // DT_NEEDED from PT_DYNAMIC; names live in DT_STRTAB (an address).
  const Elf64_Phdr* dyn_ph = nullptr;
  for (int i = 0; i < eh->e_phnum; ++i)
    if (ph[i].p_type == PT_DYNAMIC) dyn_ph = &ph[i];
  REQUIRE(dyn_ph != nullptr);
  const size_t ndyn = dyn_ph->p_filesz / sizeof(Elf64_Dyn);
  const auto* dyn = at<Elf64_Dyn>(file, dyn_ph->p_offset, ndyn);
  uint64_t strtab = 0, strsz = 0;
  std::vector<uint64_t> needed_offsets;
  for (size_t i = 0; i < ndyn && dyn[i].d_tag != DT_NULL; ++i) {
    if (dyn[i].d_tag == DT_STRTAB) strtab = dyn[i].d_un.d_ptr;
    if (dyn[i].d_tag == DT_STRSZ) strsz = dyn[i].d_un.d_val;
    if (dyn[i].d_tag == DT_NEEDED) needed_offsets.push_back(dyn[i].d_un.d_val);
  }
  REQUIRE(strtab != 0);
  REQUIRE(strsz != 0);
  const uint64_t strtab_off = file_offset(strtab);
  for (uint64_t off : needed_offsets) info.needed.push_back(cstr(file, strtab_off, strsz, off));

  // .dynsym from the section headers, with its string table (sh_link).
  const auto* sh = at<Elf64_Shdr>(file, eh->e_shoff, eh->e_shnum);
  int dynsym = -1;
  for (int i = 0; i < eh->e_shnum; ++i)
    if (sh[i].sh_type == SHT_DYNSYM) dynsym = i;
  REQUIRE(dynsym >= 0);
  REQUIRE(sh[dynsym].sh_entsize == sizeof(Elf64_Sym));
  REQUIRE(sh[dynsym].sh_link < eh->e_shnum);
  const Elf64_Shdr& names = sh[sh[dynsym].sh_link];
  const size_t nsym = sh[dynsym].sh_size / sizeof(Elf64_Sym);
  const auto* syms = at<Elf64_Sym>(file, sh[dynsym].sh_offset, nsym);
  for (size_t i = 1; i < nsym; ++i) {  // entry 0 is the null symbol
    Symbol s;
    s.name = cstr(file, names.sh_offset, names.sh_size, syms[i].st_name);
    s.bind = ELF64_ST_BIND(syms[i].st_info);
    s.type = ELF64_ST_TYPE(syms[i].st_info);
    s.visibility = ELF64_ST_VISIBILITY(syms[i].st_other);
    s.defined = syms[i].st_shndx != SHN_UNDEF;
    info.dynsym.push_back(s);
  }
  return info;
}

const ElfInfo& libvcudnn() {
  static const ElfInfo info = read_elf(vcudnn::test::libvcudnn_path());
  return info;
}

std::map<std::string, Symbol> by_name(const std::vector<Symbol>& syms) {
  std::map<std::string, Symbol> m;
  for (const auto& s : syms) m[s.name] = s;
  return m;
}

const std::vector<std::string> kHooked = {
#define VCUDNN_CUDNN_HOOK(short_name, fn) #fn,
#include "runtime/cudnn_api.def"
#undef VCUDNN_CUDNN_HOOK
};

const std::vector<std::string> kUsedOnly = {
#define VCUDNN_CUDNN_USED(fn) #fn,
#include "runtime/cudnn_api.def"
#undef VCUDNN_CUDNN_USED
};

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// cudnn*, cublas* (cuBLASLt included), cuda* and __cuda* (CUDA runtime), cu[A-Z]* (driver), vcudnn*.
bool interposable_name(const std::string& s) {
  if (s == "dlsym") return true;  // driver entry points looked up on a libcuda handle (entry_points.h)
  for (const char* prefix : {"cudnn", "cublas", "cuda", "__cuda", "nccl", "vcudnn"})
    if (starts_with(s, prefix)) return true;
  return s.size() > 2 && starts_with(s, "cu") && s[2] >= 'A' && s[2] <= 'Z';
}

void check_exported(const std::map<std::string, Symbol>& syms, const std::string& name) {
  INFO(name);
  auto it = syms.find(name);
  REQUIRE(it != syms.end());
  CHECK(it->second.defined);
  CHECK(it->second.bind == STB_GLOBAL);
  CHECK(it->second.type == STT_FUNC);
  CHECK(it->second.visibility == STV_DEFAULT);
}

}  // namespace

TEST_CASE("elf: libvcudnn.so needs only system libraries", "[elf]") {
  const auto& needed = libvcudnn().needed;
  INFO("DT_NEEDED: " << Catch::Detail::stringify(needed));
  REQUIRE_FALSE(needed.empty());  // at least libc
  const std::set<std::string> allowed = {
      "libc.so.6",  "libm.so.6",       "libstdc++.so.6", "libgcc_s.so.1",  "ld-linux-x86-64.so.2",
      "libdl.so.2", "libpthread.so.0", "librt.so.1",     "libsqlite3.so.0"};
  for (const auto& n : needed) {
    INFO("needed " << n);
    CHECK(allowed.count(n) == 1);
    for (const char* banned : {"cudnn", "cudart", "cublas", "libcuda", "nccl", "spdlog", "fmt"})
      CHECK(n.find(banned) == std::string::npos);
  }
  CHECK(std::set<std::string>(needed.begin(), needed.end()).count("libc.so.6") == 1);
}

TEST_CASE("elf: every hooked cuDNN function is exported", "[elf]") {
  REQUIRE(kHooked.size() == 23);  // 4 handle calls, cudnnBackendExecute, 18 of the convolution family
  const auto syms = by_name(libvcudnn().dynsym);
  for (const auto& name : kHooked) check_exported(syms, name);
}

TEST_CASE("elf: pointer-tracking hooks of cuDNN, cuBLAS and cuBLASLt are exported", "[elf]") {
  const auto syms = by_name(libvcudnn().dynsym);
  // Generated (tools/gen_tracked_hooks.py): deprecated, _64, overloaded-in-C++ and Lt forms.
  for (const char* name : {"cudnnBatchNormalizationForwardTraining", "cudnnBatchNormalizationForwardTrainingEx",
                           "cudnnRNNForward", "cudnnBackendGetAttribute", "cublasSgemm_v2", "cublasSgemm_v2_64",
                           "cublasGemmEx", "cublasGemmStridedBatchedEx", "cublasLtMatmul"})
    check_exported(syms, name);
  // Hand-written (interpose/library_hooks.cpp): pointers that outlive the call.
  for (const char* name :
       {"cudnnBackendCreateDescriptor", "cudnnBackendSetAttribute", "cudnnBackendGetAttribute", "cudnnBackendExecute",
        "cudnnBackendDestroyDescriptor", "cudnnSetDropoutDescriptor",
        "cudnnFusedOpsExecute", "cublasSetWorkspace_v2", "cublasLtMatmulDescSetAttribute"})
    check_exported(syms, name);
  // Every pointer-taking function, not a sample: the installed cuDNN 9 / cuBLAS 13 have about 55 /
  // 520 / 14 (cudnn_hooks.cpp adds 22 cuDNN hooks).
  int cudnn = 0, cublas = 0, cublaslt = 0;
  for (const auto& [name, sym] : syms) {
    if (!sym.defined) continue;
    cudnn += starts_with(name, "cudnn");
    cublaslt += starts_with(name, "cublasLt");
    cublas += starts_with(name, "cublas") && !starts_with(name, "cublasLt");
  }
  CHECK(cudnn >= 22 + 50);
  CHECK(cublas >= 500);
  CHECK(cublaslt >= 10);
}

// interpose/nccl_hooks.cpp: the functions that carry device pointers, and none of NCCL's others (a
// hook of those would have to forward them too).
TEST_CASE("elf: NCCL's pointer-carrying functions are exported, no other of NCCL's", "[elf]") {
  const auto syms = by_name(libvcudnn().dynsym);
  const std::set<std::string> hooked = {
      "ncclAllReduce", "ncclBroadcast",  "ncclBcast",   "ncclReduce",     "ncclAllGather",
      "ncclReduceScatter", "ncclAlltoAll", "ncclGather", "ncclScatter",   "ncclSend",
      "ncclRecv",      "ncclGroupStart", "ncclGroupEnd", "ncclRedOpCreatePreMulSum", "ncclCommRegister",
      "ncclCommWindowRegister"};
  for (const auto& name : hooked) check_exported(syms, name);
  int defined = 0;
  for (const auto& [name, sym] : syms) defined += sym.defined && starts_with(name, "nccl");
  CHECK(defined == static_cast<int>(hooked.size()));
  for (const char* name : {"ncclGetVersion", "ncclCommInitRank", "ncclCommDestroy", "ncclCommDeregister"}) {
    INFO(name);
    auto it = syms.find(name);
    CHECK((it == syms.end() || !it->second.defined));
  }
}

TEST_CASE("elf: the vcudnn API is exported", "[elf]") {
  const auto syms = by_name(libvcudnn().dynsym);
  for (const char* name :
       {"vcudnnCreate", "vcudnnIterationBoundary", "vcudnnGetCudnnHandle", "vcudnnDestroy", "vcudnnGetVersionString",
        "vcudnnGetConvolutionPlanInfo", "vcudnnGetExecutionPlanInfo", "vcudnnGetMemoryStats"}) {
    INFO(name);
    auto it = syms.find(name);
    REQUIRE(it != syms.end());
    CHECK(it->second.defined);
    CHECK(it->second.bind == STB_GLOBAL);
    CHECK(it->second.type == STT_FUNC);
  }
}

TEST_CASE("elf: only cudnn*, cublas*, cuda*, __cuda*, cu[A-Z]*, nccl*, vcudnn* and dlsym are defined", "[elf]") {
  int defined = 0;
  for (const auto& s : libvcudnn().dynsym) {
    if (!s.defined || s.bind == STB_LOCAL) continue;
    ++defined;
    INFO("defined symbol " << s.name << " bind " << s.bind << " type " << s.type);
    CHECK(interposable_name(s.name));
    CHECK_FALSE(starts_with(s.name, "_Z"));  // no C++ symbol
    CHECK(s.name.find("fmt") == std::string::npos);
    CHECK(s.name.find("spdlog") == std::string::npos);
  }
  CHECK(defined >= static_cast<int>(kHooked.size()) + 3);
}

TEST_CASE("elf: descriptor getters and other used-only functions are not interposed", "[elf]") {
  REQUIRE_FALSE(kUsedOnly.empty());
  const auto syms = by_name(libvcudnn().dynsym);
  for (const auto& name : kUsedOnly) {
    INFO(name);
    auto it = syms.find(name);
    CHECK((it == syms.end() || !it->second.defined));
  }
  // Functions that take no device pointer are not interposed either: descriptor creators,
  // setters and getters, handles, streams (the graph API's descriptors are, for the shadow of
  // runtime/backend_shadow.h).
  for (const char* name : {"cudnnSetTensor4dDescriptor", "cudnnCreateTensorDescriptor",
                           "cudnnGetDropoutDescriptor", "cublasCreate_v2", "cublasSetStream_v2", "cublasLtCreate",
                           "cublasLtMatmulDescCreate", "cublasLtMatmulAlgoGetHeuristic"}) {
    INFO(name);
    auto it = syms.find(name);
    CHECK((it == syms.end() || !it->second.defined));
  }
}

// A driver hook missing from entry_points' list would be handed out by the dynamic linker but not by
// dlsym on a libcuda handle or cuGetProcAddress: launches through those would go unseen.
TEST_CASE("elf: every exported driver hook is handed out by the entry-point lookups, and only those", "[elf]") {
  std::set<std::string> exported;
  for (const auto& s : libvcudnn().dynsym) {
    if (s.defined && s.bind != STB_LOCAL && s.name.size() > 2 && starts_with(s.name, "cu") && s.name[2] >= 'A' &&
        s.name[2] <= 'Z' && !starts_with(s.name, "cuGetProcAddress"))
      exported.insert(s.name);
  }
  size_t n = 0;
  const char* const* names = vcudnn::entry_points::hooked_names(&n);
  const std::set<std::string> listed(names, names + n);
  CHECK(exported == listed);
  CHECK(listed.count("cuLaunchKernelEx"));
  CHECK(listed.count("cuPointerGetAttribute"));
#if defined(__x86_64__)
  CHECK(by_name(libvcudnn().dynsym).count("dlsym") == 1);
#endif
  CHECK(by_name(libvcudnn().dynsym).count("cuGetProcAddress_v2") == 1);
}
