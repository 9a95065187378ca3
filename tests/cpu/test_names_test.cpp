// The suites' own test names. Catch v2's console reporter indents a wrapped test name by where its
// first ": " ends, and aborts (an assertion, or std::out_of_range in a release build) when that
// indent reaches the console's 79 columns: a test whose name has its first ": " that far in crashes
// the whole binary the first time it prints its header (a WARN, a failure), as one did on the GPU
// machine (2026-11-25); a little short of that, each wrapped line holds a few characters. Every
// TEST_CASE name in tests/ is read from the source here.
#include <catch2/catch.hpp>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/common/test_util.h"

namespace {

struct Named {
  std::string file;
  std::string name;
};

// The string literals right after each "TEST_CASE(", joined as the compiler joins them.
std::vector<Named> test_names(const std::string& file, const std::string& text) {
  std::vector<Named> out;
  const std::string key = "TEST_CASE(";
  for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) {
    size_t i = at + key.size();
    std::string name;
    bool any = false;
    while (true) {
      while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
      if (i >= text.size() || text[i] != '"') break;
      any = true;
      for (++i; i < text.size() && text[i] != '"'; ++i) {
        if (text[i] == '\\' && i + 1 < text.size()) ++i;
        name += text[i];
      }
      ++i;  // the closing quote
    }
    if (any) out.push_back({file, name});
  }
  return out;
}

}  // namespace

TEST_CASE("test names: the first \": \" of every TEST_CASE name ends before Catch's console indent limit",
          "[tests]") {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(vcudnn::test::source_dir()) / "tests";
  std::vector<Named> all;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (!entry.is_regular_file() || entry.path().extension() != ".cpp") continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    for (Named& n : test_names(entry.path().lexically_relative(root).string(), text.str())) all.push_back(n);
  }
  REQUIRE(all.size() > 300);  // every suite's tests were found
  // Catch v2: the wrapped lines' indent is the index after the first ": "; the console is 79 wide, and
  // at 79 it aborts. 64 leaves a wrapped line 15 characters at least (at 75, 4: unreadable).
  constexpr size_t kMostIndent = 64;
  for (const Named& n : all) {
    const size_t colon = n.name.find(": ");
    INFO(n.file << ": \"" << n.name << "\"");
    CHECK((colon == std::string::npos || colon + 2 <= kMostIndent));
  }
  // The parser itself, on the name that crashed.
  const auto parsed = test_names("x.cpp", "TEST_CASE(\n    \"a: b \\\"c\\\" \"\n    \"d\", \"[t]\") {}");
  REQUIRE(parsed.size() == 1);
  CHECK(parsed[0].name == "a: b \"c\" d");
}
