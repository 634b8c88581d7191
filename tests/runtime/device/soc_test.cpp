// SoC identification for the start-up check: the selector table (same as cmake/GenbridgeSoc.cmake),
// runtime SoC codes, the npu-smi parser on captured text, and PATH lookup of npu-smi.
#include "runtime/device/soc.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace genbridge::runtime {
namespace {

TEST(Soc, selector_table_matches_the_build_table) {
  struct Want {
    const char* selector;
    Generation gen;
    const char* soc;
    int code;
  };
  for (const Want& w : {Want{"910B", Generation::kAscend910, "Ascend910B1", 220},
                        Want{"Ascend910B3", Generation::kAscend910, "Ascend910B3", 223},
                        Want{"Ascend910B4", Generation::kAscend910, "Ascend910B4", 224},
                        Want{"910", Generation::kAscend910, "Ascend910_9382", 253},
                        Want{"910C", Generation::kAscend910, "Ascend910_9382", 253},
                        Want{"Ascend910_9392", Generation::kAscend910, "Ascend910_9392", 251},
                        Want{"Ascend910_9399", Generation::kAscend910, "Ascend910_9399", 0},
                        Want{"950", Generation::kAscend950, "Ascend950PR_9599", 260},
                        Want{"Ascend950", Generation::kAscend950, "Ascend950PR_9599", 260},
                        Want{"Ascend950DT_9591", Generation::kAscend950, "Ascend950DT_9591", 260}}) {
    auto s = normalize_soc_selector(w.selector);
    ASSERT_TRUE(s.ok()) << w.selector << ": " << s.status().to_string();
    EXPECT_EQ(s->generation, w.gen) << w.selector;
    EXPECT_EQ(s->soc, w.soc) << w.selector;
    EXPECT_EQ(s->code, w.code) << w.selector;
  }
  for (const char* bad : {"", "910A", "Ascend910B5", "Ascend910_9482", "Ascend950PR_99", "A5", "960"}) {
    auto s = normalize_soc_selector(bad);
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(s.status().message(),
              std::string("SoC selector '") + bad +
                  "' is not known; accepted selectors: 910B, Ascend910B1..Ascend910B4, 910, 910C, Ascend910_93xx "
                  "(e.g. Ascend910_9382, Ascend910_9392), 950, Ascend950, Ascend950PR_xxxx, Ascend950DT_xxxx");
  }
}

TEST(Soc, runtime_codes) {
  for (int c = 220; c <= 225; ++c) EXPECT_EQ(soc_from_code(c)->generation, Generation::kAscend910) << c;
  for (int c = 250; c <= 255; ++c) EXPECT_EQ(soc_from_code(c)->generation, Generation::kAscend910) << c;
  EXPECT_EQ(soc_from_code(260)->generation, Generation::kAscend950);
  EXPECT_EQ(soc_from_code(223)->soc, "Ascend910B3");
  EXPECT_EQ(soc_from_code(253)->soc, "Ascend910_9382");
  for (int c : {0, 104, 219, 226, 240, 256, 261}) {
    EXPECT_EQ(soc_from_code(c).status().message(),
              "runtime SoC code " + std::to_string(c) +
                  " is not known; known codes: 220-225 (910B, A2), 250-255 (910_93, A3), 260 (950, A5)");
  }
  EXPECT_EQ(generation_from_target("Ascend910").value(), Generation::kAscend910);
  EXPECT_EQ(generation_from_target("Ascend950").value(), Generation::kAscend950);
  EXPECT_EQ(generation_from_target("Cuda90").status().message(),
            "provider target 'Cuda90' is not a known generation (Ascend910, Ascend950)");
}

// Captured-style `npu-smi info` output of an A2 (910B) server: the device table names the chip "910B3".
constexpr const char* kA2Table = R"(+------------------------------------------------------------------------------------------------+
| npu-smi 23.0.rc3                 Version: 23.0.rc3                                             |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 93.4        36                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3396 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | OK            | 91.0        35                0    / 0             |
| 0                         | 0000:01:00.0  | 0           0    / 0          3396 / 65536         |
+===========================+===============+====================================================+
)";

// An A3 server's table prints "Ascend910" without the variant.
constexpr const char* kA3Table = R"(| NPU     Name                | Health          | Power(W)     Temp(C)           Hugepages-Usage(page) |
| Chip    Phy-ID              | Bus-Id          | AICore(%)    Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0       Ascend910           | OK              | 166.9        39                0    / 0             |
| 0       0                   | 0000:9D:00.0    | 0            0    / 0          3407 / 65536         |
)";

constexpr const char* kA5Table = R"(| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| 0     Ascend950PR_9599    | OK            | 120.3       41                0    / 0             |
)";

TEST(Soc, parses_npu_smi_device_tables) {
  auto a2 = parse_npu_smi(kA2Table);
  ASSERT_TRUE(a2.ok()) << a2.status().to_string();
  EXPECT_EQ(a2->generation, Generation::kAscend910);
  EXPECT_EQ(a2->soc, "Ascend910B3");
  EXPECT_EQ(a2->code, 223);
  auto a3 = parse_npu_smi(kA3Table);
  ASSERT_TRUE(a3.ok()) << a3.status().to_string();
  EXPECT_EQ(a3->generation, Generation::kAscend910);
  EXPECT_EQ(a3->soc, "Ascend910_93xx (variant not printed)");
  auto a5 = parse_npu_smi(kA5Table);
  ASSERT_TRUE(a5.ok()) << a5.status().to_string();
  EXPECT_EQ(a5->generation, Generation::kAscend950);
  EXPECT_EQ(a5->soc, "Ascend950PR_9599");
  EXPECT_EQ(a5->code, 260);
}

TEST(Soc, parses_key_value_names_and_soc_version_codes) {
  EXPECT_EQ(parse_npu_smi("        Chip Name                      : Ascend 910B4\n")->soc, "Ascend910B4");
  EXPECT_EQ(parse_npu_smi("Chip Name : Ascend910_9392\n")->code, 251);
  EXPECT_EQ(parse_npu_smi("Chip Name : 910B2C\n")->code, 222);
  EXPECT_EQ(parse_npu_smi("SoC Version : 253\n")->soc, "Ascend910_9382");
  EXPECT_EQ(parse_npu_smi("soc_version=260")->generation, Generation::kAscend950);
  EXPECT_EQ(parse_npu_smi("Name: Ascend950DT_9591")->soc, "Ascend950DT_9591");
}

TEST(Soc, rejects_npu_smi_text_without_a_known_soc) {
  auto none = parse_npu_smi("npu-smi: error while loading shared libraries: libdrvdsmi_host.so\nsecond line");
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(none.status().message(),
            "npu-smi output names no known SoC (first line: 'npu-smi: error while loading shared libraries: "
            "libdrvdsmi_host.so')");
  // Look-alikes that are not chip names: versions, bus ids, an unknown 910B variant.
  EXPECT_FALSE(parse_npu_smi("npu-smi 23.0.910 Version: 910B9 Bus-Id 0000:910B:00.0").ok());
  EXPECT_EQ(parse_npu_smi("SoC Version: 240").status().message(),
            "runtime SoC code 240 is not known; known codes: 220-225 (910B, A2), 250-255 (910_93, A3), 260 (950, A5)");
  EXPECT_EQ(parse_npu_smi(std::string(kA2Table) + kA5Table).status().message(),
            "npu-smi reports devices of two generations: Ascend910B3 (Ascend910) and Ascend950PR_9599 (Ascend950)");
}

// A temporary directory for PATH experiments, removed at the end of the test.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/gb_soc_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  void script(const std::string& name, const std::string& body) const {
    const auto p = path / name;
    std::ofstream(p) << "#!/bin/sh\n" << body;
    ::chmod(p.c_str(), 0755);
  }
};

TEST(Soc, npu_smi_lookup_on_path) {
  TempDir empty, bin;
  bin.script("npu-smi", std::string("cat <<'EOF'\n") + kA2Table + "EOF\n");
  EXPECT_EQ(find_on_path("npu-smi", empty.path.string()), "");
  EXPECT_EQ(find_on_path("npu-smi", ""), "");
  EXPECT_EQ(find_on_path("npu-smi", empty.path.string() + "::" + bin.path.string()), (bin.path / "npu-smi").string());
  // Absent: no output, no error.
  auto absent = read_npu_smi(empty.path.string());
  ASSERT_TRUE(absent.ok());
  EXPECT_FALSE(absent->has_value());
  // Present: its output, exactly.
  auto present = read_npu_smi(bin.path.string());
  ASSERT_TRUE(present.ok()) << present.status().to_string();
  ASSERT_TRUE(present->has_value());
  EXPECT_EQ(**present, kA2Table);
  // A non-executable file of that name is not a command.
  TempDir plain;
  std::ofstream(plain.path / "npu-smi") << "not a program";
  EXPECT_EQ(find_on_path("npu-smi", plain.path.string()), "");
  // Present but failing: Unavailable, with its exit status and output.
  TempDir broken;
  broken.script("npu-smi", "echo 'dcmi module initialize failed'\nexit 3\n");
  auto failed = read_npu_smi(broken.path.string());
  EXPECT_EQ(failed.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(failed.status().message(), "npu-smi at " + (broken.path / "npu-smi").string() +
                                           " failed (exit status 3): dcmi module initialize failed\n");
}

}  // namespace
}  // namespace genbridge::runtime
