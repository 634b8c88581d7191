#include "runtime/engine/npy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

namespace genbridge::engine {
namespace {

TEST(Npy, header_and_payload_follow_format_1_0) {
  const auto path = std::filesystem::temp_directory_path() / "genbridge_npy_test.npy";
  std::vector<float> v{1.f, -2.f, 3.5f, 0.f, 7.f, 8.f};
  ASSERT_TRUE(write_npy_f32(path.string(), v, 2, 3).ok());
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(std::memcmp(bytes.data(), "\x93NUMPY\x01\x00", 8), 0);
  const size_t hlen = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
  EXPECT_EQ((10 + hlen) % 64, 0u);
  const std::string header(bytes.data() + 10, hlen);
  EXPECT_NE(header.find("'descr': '<f4'"), std::string::npos);
  EXPECT_NE(header.find("'shape': (2, 3)"), std::string::npos);
  EXPECT_EQ(header.back(), '\n');
  ASSERT_EQ(bytes.size(), 10 + hlen + v.size() * 4);
  EXPECT_EQ(std::memcmp(bytes.data() + 10 + hlen, v.data(), v.size() * 4), 0);
  std::filesystem::remove(path);
}

TEST(Npy, shape_mismatch_and_unwritable_path) {
  std::vector<float> v(5);
  EXPECT_EQ(write_npy_f32("/tmp/x.npy", v, 2, 3).message(), "write_npy_f32: 5 values do not form shape (2, 3)");
  EXPECT_EQ(write_npy_f32("/nonexistent-dir/x.npy", v, 1, 5).code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace genbridge::engine
