// The real dlsym. libvcudnn.so exports a dlsym of its own (interpose/entry_points.cpp), and links
// with -Bsymbolic, so a plain dlsym() call inside vcudnn would reach that hook: vcudnn's own lookups
// (real_api.cpp) go through real_dlsym() instead.
#pragma once

namespace vcudnn {

using DlsymFn = void* (*)(void*, const char*);

// glibc's dlsym (found once with dlvsym, by version, never through the exported name); a function
// that finds nothing when even that fails. Safe to call at any time, from any thread, before
// static constructors ran. Called from vcudnn, so RTLD_NEXT means "after libvcudnn".
DlsymFn real_dlsym_fn() noexcept;
inline void* real_dlsym(void* handle, const char* name) { return real_dlsym_fn()(handle, name); }

}  // namespace vcudnn
