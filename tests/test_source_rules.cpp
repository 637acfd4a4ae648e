// Rules of the source tree that review alone would let slip:
//  - layering: the folders under src/ are ordered in docs/architecture.md
//    (between the "layers:" markers, top first); a folder includes only
//    itself and folders listed below it, so there is no cycle between folders;
//  - no function in src/ is longer than 80 lines from its signature to its
//    closing brace.
// Each rule is a function over file contents, tried here on synthetic input
// (so a wrong include or a long function is shown to fail it) and then on
// the tree itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

struct SourceFile {
  std::string path;  // relative to src/, e.g. "train/train.cpp"
  std::string text;
};

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<SourceFile> source_tree() {
  const fs::path src = fs::path(DPT_SOURCE_DIR) / "src";
  std::vector<SourceFile> files;
  for (const auto& e : fs::recursive_directory_iterator(src)) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() && (ext == ".h" || ext == ".cpp" || ext == ".cu" || ext == ".cuh"))
      files.push_back({fs::relative(e.path(), src).string(), read(e.path())});
  }
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.path < b.path; });
  return files;
}

// The folders in the order docs/architecture.md gives them, top first: the
// lines of the block that starts at a line "layers:" and ends at a blank
// line, each "folder  description".
std::vector<std::string> layer_order(const std::string& doc) {
  std::istringstream lines(doc);
  std::vector<std::string> order;
  bool in = false;
  for (std::string line; std::getline(lines, line);) {
    if (!in) {
      in = line == "layers:";
      continue;
    }
    std::istringstream words(line);
    std::string folder;
    if (!(words >> folder) || folder.rfind("```", 0) == 0) break;
    order.push_back(folder);
  }
  return order;
}

// "file:line includes x/y.h, but folder may include only ..." for each
// include that goes up the order (or to a folder the order does not name).
std::vector<std::string> layering_violations(const std::vector<std::string>& order,
                                             const std::vector<SourceFile>& files) {
  const auto rank = [&](const std::string& folder) {
    auto it = std::find(order.begin(), order.end(), folder);
    return it == order.end() ? -1 : static_cast<int>(it - order.begin());
  };
  static const std::regex include(R"(^\s*#\s*include\s+"([^"/]+)/[^"]+")");
  std::vector<std::string> out;
  for (const SourceFile& f : files) {
    const std::string folder = f.path.substr(0, f.path.find('/'));
    const int mine = rank(folder);
    if (mine < 0) {
      out.push_back("src/" + f.path + ": its folder '" + folder + "' is not in the layer order");
      continue;
    }
    std::istringstream lines(f.text);
    int n = 0;
    for (std::string line; std::getline(lines, line);) {
      ++n;
      std::smatch m;
      if (!std::regex_search(line, m, include)) continue;
      const int theirs = rank(m[1].str());
      if (theirs >= mine) continue;  // itself or below
      out.push_back("src/" + f.path + ":" + std::to_string(n) + " includes \"" + m[1].str() + "/...\", but " +
                    folder + "/ may include only itself and the folders below it in docs/architecture.md");
    }
  }
  return out;
}

// The text with comments, string and character literals blanked (newlines
// kept), so braces in them are not counted.
std::string code_only(const std::string& s) {
  std::string out = s;
  enum { Code, Line, Block, Str, Chr } st = Code;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i], next = i + 1 < s.size() ? s[i + 1] : '\0';
    const auto blank = [&] { if (out[i] != '\n') out[i] = ' '; };
    switch (st) {
      case Code:
        if (c == '/' && next == '/') st = Line, blank();
        else if (c == '/' && next == '*') st = Block, blank();
        else if (c == '"') st = Str;
        else if (c == '\'' && !(i > 0 && std::isxdigit(static_cast<unsigned char>(s[i - 1])))) st = Chr;  // not 1'000
        break;
      case Line:
        if (c == '\n') st = Code; else blank();
        break;
      case Block:
        blank();
        if (c == '*' && next == '/') out[++i] = ' ', st = Code;
        break;
      case Str:
      case Chr:
        if (c == '\\') { blank(); if (i + 1 < s.size()) { ++i; blank(); } continue; }
        if ((st == Str && c == '"') || (st == Chr && c == '\'')) st = Code; else blank();
        break;
    }
  }
  // Preprocessor lines (and their continuations) hold no code that counts.
  size_t at = 0;
  bool continued = false;
  while (at < out.size()) {
    size_t end = out.find('\n', at);
    if (end == std::string::npos) end = out.size();
    const size_t first = out.find_first_not_of(" \t", at);
    const bool directive = continued || (first < end && out[first] == '#');
    continued = directive && end > at && s[end - 1] == '\\';
    if (directive) std::fill(out.begin() + static_cast<long>(at), out.begin() + static_cast<long>(end), ' ');
    at = end + 1;
  }
  return out;
}

struct LongFunction {
  std::string where;  // file:line of the signature
  int lines;
};

// Functions (free, member, lambdas at namespace scope) longer than `limit`
// lines from the first line of their signature to their closing brace. A
// '{' in a namespace or class body opens a function when the text since the
// last ';', '{' or '}' there has a '(' and is not a namespace, class, struct,
// union or enum; everything inside a function is its own.
std::vector<LongFunction> long_functions(const SourceFile& f, int limit) {
  const std::string code = code_only(f.text);
  static const std::regex aggregate(R"(^\s*(template\s*<[^>]*>\s*)?(namespace|class|struct|union|enum|extern)\b)");
  struct Scope {
    bool function;
    int start;
  };
  std::vector<Scope> scopes;
  std::vector<LongFunction> out;
  std::string pending;  // declaration text since the last ; { } outside functions
  int line = 1, pending_line = 0, init_depth = 0;
  const auto in_function = [&] { return !scopes.empty() && scopes.back().function; };
  // A constructor's member initialised with braces (": a_{x}, b_{y} {"):
  // part of its signature, not a body.
  static const std::regex member_init(R"(\)\s*(const\s*|noexcept\s*)*:[^:][^;]*[A-Za-z0-9_>]\s*$)");
  for (char c : code) {
    if (c == '\n') ++line;
    if (init_depth > 0) {
      init_depth += c == '{' ? 1 : c == '}' ? -1 : 0;
      pending += c;
      continue;
    }
    if (!in_function() && c == '{' && std::regex_search(pending, member_init)) {
      init_depth = 1;
      pending += c;
      continue;
    }
    if (in_function()) {
      if (c == '{') scopes.push_back({true, 0});
      if (c == '}') {
        const Scope s = scopes.back();
        scopes.pop_back();
        if (s.start > 0 && line - s.start + 1 > limit)
          out.push_back({"src/" + f.path + ":" + std::to_string(s.start), line - s.start + 1});
      }
      continue;
    }
    if (c == '{') {
      const bool fn = pending.find('(') != std::string::npos && !std::regex_search(pending, aggregate);
      scopes.push_back({fn, fn ? pending_line : 0});
      pending.clear();
    } else if (c == '}' || c == ';') {
      if (c == '}' && !scopes.empty()) scopes.pop_back();
      pending.clear();
    } else {
      if (pending.find_first_not_of(" \t\n") == std::string::npos && c != ' ' && c != '\t' && c != '\n')
        pending_line = line;
      pending += c;
    }
  }
  return out;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

std::vector<std::string> tree_order() {
  return layer_order(read(fs::path(DPT_SOURCE_DIR) / "docs" / "architecture.md"));
}

TEST(Layering, AnIncludeUpTheOrderIsNamedWithItsLine) {
  const std::vector<std::string> order{"train", "parallel", "core"};
  const std::vector<SourceFile> files{
      {"parallel/zero.h", "#pragma once\n#include <vector>\n#include \"core/error.h\"\n#include \"train/timeline.h\"\n"},
      {"train/train.cpp", "#include \"parallel/zero.h\"\n#include \"train/train.h\"\n"},
      {"core/error.h", "#include \"core/dtype.h\"\n"}};
  const auto v = layering_violations(order, files);
  ASSERT_EQ(v.size(), 1u) << joined(v);
  EXPECT_NE(v[0].find("src/parallel/zero.h:4 includes \"train/...\""), std::string::npos) << v[0];
}

TEST(Layering, AFolderOutsideTheOrderIsNamed) {
  const auto v = layering_violations({"core"}, {{"extra/x.h", "#include \"core/a.h\"\n"}});
  ASSERT_EQ(v.size(), 1u);
  EXPECT_NE(v[0].find("'extra' is not in the layer order"), std::string::npos) << v[0];
}

TEST(Layering, TheDocsOrderCoversEveryFolderOnce) {
  const std::vector<std::string> order = tree_order();
  ASSERT_GE(order.size(), 10u) << "docs/architecture.md has no 'layers:' block";
  std::vector<std::string> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << joined(order);
  for (const auto& e : fs::directory_iterator(fs::path(DPT_SOURCE_DIR) / "src")) {
    if (!e.is_directory()) continue;
    EXPECT_NE(std::find(order.begin(), order.end(), e.path().filename().string()), order.end())
        << e.path().filename() << " is missing from docs/architecture.md's layers";
  }
}

TEST(Layering, EveryIncludeInSrcGoesDownTheOrder) {
  const auto v = layering_violations(tree_order(), source_tree());
  EXPECT_TRUE(v.empty()) << joined(v);
}

TEST(FunctionLength, ALongFunctionIsFoundAndShortOnesAreNot) {
  std::string body;
  for (int i = 0; i < 85; ++i) body += "  x += " + std::to_string(i) + ";\n";
  const std::string text = "#include <x>\nnamespace a {\nstruct S {\n  int f() const { return 1; }\n};\n"
                           "// a comment with a brace {\n"
                           "S::S(int a)\n    : a_{a},\n      b_{a + 1} {\n" + body + "}\n"
                           "int long_one(int x,\n             int y) {\n" + body + "  if (x) {\n    y = '{';\n  }\n"
                           "  return x + y;\n}\nvoid short_one() { const char* s = \"}}}\"; }\n}  // namespace a\n";
  const auto v = long_functions({"a/b.cpp", text}, 80);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].where, "src/a/b.cpp:7");  // the constructor, from its signature
  EXPECT_EQ(v[0].lines, 3 + 85 + 1);
  EXPECT_EQ(v[1].where, "src/a/b.cpp:96");
  EXPECT_EQ(v[1].lines, 2 + 85 + 3 + 2);
  EXPECT_TRUE(long_functions({"a/b.cpp", text}, 100).empty());
}

TEST(FunctionLength, NoFunctionInSrcIsOver80Lines) {
  std::vector<std::string> v;
  for (const SourceFile& f : source_tree())
    for (const LongFunction& l : long_functions(f, 80)) v.push_back(l.where + ": " + std::to_string(l.lines) + " lines");
  EXPECT_TRUE(v.empty()) << joined(v);
}

// "file:line: ..." for each place outside the catalog that compares a
// string with a strategy's name (or asks a name for its ZeRO stage): below
// the command line's edge, code asks the strategy's record.
std::vector<std::string> strategy_name_comparisons(const std::vector<SourceFile>& files) {
  static const std::regex compared(
      R"re((==|!=|compare\(|find\(.*,)\s*"(local|ddp|zero[123]|fsdp|hsdp|dp)"|"(local|ddp|zero[123]|fsdp|hsdp|dp)"\s*(==|!=)|zero_stage\()re");
  std::vector<std::string> out;
  for (const SourceFile& f : files) {
    // The catalog and the command line (the edge, where names are parsed).
    if (f.path.rfind("parallel/catalog", 0) == 0 || f.path.rfind("tools/", 0) == 0) continue;
    std::istringstream lines(f.text);
    int n = 0;
    for (std::string line; std::getline(lines, line);) {
      ++n;
      if (std::regex_search(line, compared)) out.push_back("src/" + f.path + ":" + std::to_string(n) + ": " + line);
    }
  }
  return out;
}

TEST(StrategyNames, AComparisonIsFound) {
  const auto v = strategy_name_comparisons({{"train/x.cpp", "int a;\n  if (o.strategy == \"dp\") return;\n"},
                                            {"parallel/catalog.cpp", "if (name == \"ddp\") {}\n"}});
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].rfind("src/train/x.cpp:2:", 0), 0u) << v[0];
}

TEST(StrategyNames, NoCodeOutsideTheCatalogComparesThem) {
  const auto v = strategy_name_comparisons(source_tree());
  EXPECT_TRUE(v.empty()) << joined(v);
}

}  // namespace
