// write_output_file (output_file.h; Note [Writing through symlinks]).
#include "planner/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace vcudnn {
namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// The final target of `path` through symbolic links (at most 40, as the kernel allows).
Result<std::string> follow_links(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path at = path;
  for (int hops = 0; hops < 40; ++hops) {
    struct stat st {};
    if (::lstat(at.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return at.string();
    std::error_code ec;
    const fs::path next = fs::read_symlink(at, ec);
    if (ec) return Error{"cannot read the symbolic link " + at.string() + ": " + ec.message()};
    at = next.is_absolute() ? next : at.parent_path() / next;
  }
  return Error{path + ": too many levels of symbolic links"};
}

}  // namespace

Status write_output_file(const std::string& path, const std::string& text) {
  try {
    const Result<std::string> target = follow_links(path);
    if (!target) return target.error();
    const std::string& file = target.value();
    const std::string shown = file == path ? path : path + " (a link to " + file + ")";
    struct stat st {};
    if (::stat(file.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      return Error{"refusing to replace " + shown + ": it is " + kind_of(st.st_mode) + ", not a regular file"};

    const std::string tmp = file + ".tmp." + std::to_string(::getpid());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return Error{"cannot create " + tmp + ": " + std::strerror(errno)};
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int e = errno;
        ::close(fd);
        ::unlink(tmp.c_str());
        return Error{"write to " + tmp + " failed: " + std::strerror(e)};
      }
      done += static_cast<size_t>(n);
    }
    if (::close(fd) != 0) {
      const int e = errno;
      ::unlink(tmp.c_str());
      return Error{"write to " + tmp + " failed: " + std::strerror(e)};
    }
    if (std::rename(tmp.c_str(), file.c_str()) != 0) {
      const int e = errno;
      ::unlink(tmp.c_str());
      return Error{"cannot rename " + tmp + " to " + file + ": " + std::strerror(e)};
    }
    return ok_status();
  } catch (const std::exception& e) {
    return Error{"cannot write " + path + ": " + e.what()};
  }
}

}  // namespace vcudnn
