// Files vcudnn writes (the trace, the access log): the whole text or nothing, and never in place
// of something that is not a regular file.
//
// Note [Writing through symlinks]
// The path is followed through symbolic links (as a shell's `>` would): the link stays and its
// final target receives the text, created if missing. The target is replaced by a rename from a
// temporary file beside it, so a reader never sees half a file; an existing target that is not a
// regular file (a device such as /dev/null, a FIFO, a folder, a socket) is refused with an error
// and left untouched, since a rename would replace it with a file.
#pragma once

#include <string>

#include "planner/result.h"

namespace vcudnn {

Status write_output_file(const std::string& path, const std::string& text);

}  // namespace vcudnn
