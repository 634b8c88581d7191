// TensorStore: single-file and sharded checkpoints (model.safetensors.index.json), and every index rule
// with its exact message.
#include "runtime/checkpoint/tensor_store.h"

#include <gtest/gtest.h>

#include "support/temp_dir.h"

namespace genbridge::model {
namespace {

using testing::TempDir;

class TensorStoreSharded : public ::testing::Test {
 protected:
  // Writes a shard holding F32 tensors of one element each, value = index in `names`.
  void shard(const std::string& file, const std::vector<std::string>& names) {
    std::vector<float> values;
    for (size_t i = 0; i < names.size(); ++i) values.push_back(static_cast<float>(i));
    std::vector<SafetensorsTensorData> t;
    for (size_t i = 0; i < names.size(); ++i) t.push_back({{names[i], DType::kF32, {1}}, &values[i]});
    ASSERT_TRUE(write_safetensors(dir_ / file, t).ok());
  }
  void index(const std::string& text) { testing::write_file_bytes(dir_ / "model.safetensors.index.json", text); }
  std::string open_error() {
    Result<TensorStore> s = TensorStore::open_dir(dir_.path());
    if (s.ok()) return "";
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    return s.status().message();
  }
  std::string idx() const { return (dir_ / "model.safetensors.index.json").string(); }
  std::string path(const std::string& f) const { return (dir_ / f).string(); }
  TempDir dir_;
};

constexpr const char* kS1 = "model-00001-of-00002.safetensors";
constexpr const char* kS2 = "model-00002-of-00002.safetensors";

TEST(TensorStore, shard_file_names_follow_hf) {
  EXPECT_EQ(shard_file_name(1, 2), "model-00001-of-00002.safetensors");
  EXPECT_EQ(shard_file_name(12, 163), "model-00012-of-00163.safetensors");
}

TEST_F(TensorStoreSharded, loads_two_shards) {
  shard(kS1, {"a", "b"});
  shard(kS2, {"c"});
  index(R"({"metadata": {"total_size": 12}, "weight_map": {"a": ")" + std::string(kS1) + R"(", "b": ")" + kS1 +
        R"(", "c": ")" + kS2 + R"("}})");
  Result<TensorStore> s = TensorStore::open_dir(dir_.path());
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->source(), idx());
  EXPECT_EQ(s->names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(s->files().size(), 2u);
  EXPECT_EQ(s->find("c")->file->path(), path(kS2));
  EXPECT_EQ(s->find("b")->file->view(*s->find("b")->tensor)->data_as<const float>()[0], 1.0f);
  EXPECT_EQ(s->find("nope"), nullptr);
}

TEST_F(TensorStoreSharded, index_wins_over_a_single_file) {
  shard(kS1, {"a"});
  shard("model.safetensors", {"x"});
  index(R"({"weight_map": {"a": ")" + std::string(kS1) + R"("}})");
  Result<TensorStore> s = TensorStore::open_dir(dir_.path());
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->names(), std::vector<std::string>{"a"});
}

TEST_F(TensorStoreSharded, nothing_to_load) {
  EXPECT_EQ(open_error(), dir_.path().string() +
                              ": no model.safetensors or model.safetensors.index.json in the checkpoint directory");
}

TEST_F(TensorStoreSharded, index_names_a_missing_shard) {
  shard(kS1, {"a"});
  index(R"({"weight_map": {"a": ")" + std::string(kS1) + R"(", "c": ")" + kS2 + R"("}})");
  EXPECT_EQ(open_error(),
            idx() + ": tensor 'c' maps to shard '" + kS2 + "', which does not exist in " + dir_.path().string());
}

TEST_F(TensorStoreSharded, duplicate_tensor_across_shards) {
  shard(kS1, {"a", "b"});
  shard(kS2, {"b", "c"});
  index(R"({"weight_map": {"a": ")" + std::string(kS1) + R"(", "b": ")" + kS1 + R"(", "c": ")" + kS2 + R"("}})");
  EXPECT_EQ(open_error(),
            path(kS2) + ": tensor 'b' is also in " + path(kS1) + " (a tensor must be in exactly one shard)");
}

TEST_F(TensorStoreSharded, shard_tensor_not_in_weight_map) {
  shard(kS1, {"a", "stray"});
  index(R"({"weight_map": {"a": ")" + std::string(kS1) + R"("}})");
  EXPECT_EQ(open_error(), idx() + ": tensor 'stray' of shard '" + kS1 + "' is not listed in weight_map");
}

TEST_F(TensorStoreSharded, weight_map_names_the_wrong_shard) {
  shard(kS1, {"a", "b"});
  shard(kS2, {"c"});
  index(R"({"weight_map": {"a": ")" + std::string(kS1) + R"(", "b": ")" + kS2 + R"(", "c": ")" + kS2 + R"("}})");
  EXPECT_EQ(open_error(), idx() + ": tensor 'b' is in shard '" + kS1 + "' but weight_map names '" + kS2 + "'");
}

TEST_F(TensorStoreSharded, weight_map_entry_missing_from_its_shard) {
  shard(kS1, {"a"});
  index(R"({"weight_map": {"a": ")" + std::string(kS1) + R"(", "ghost": ")" + kS1 + R"("}})");
  EXPECT_EQ(open_error(), idx() + ": tensor 'ghost' maps to shard '" + kS1 + "', which does not contain it");
}

TEST_F(TensorStoreSharded, shard_names_must_be_plain_file_names) {
  for (const std::string bad : {"../model.safetensors", "sub/x.safetensors", "..", ""}) {
    index(R"({"weight_map": {"a": ")" + bad + R"("}})");
    EXPECT_EQ(open_error(), idx() + ": tensor 'a' maps to '" + bad +
                                "': shard names must be plain file names in the checkpoint directory");
  }
}

TEST_F(TensorStoreSharded, shard_name_with_a_nul_character) {
  // Opened by its C string, "<shard>\u0000junk" would silently open <shard>.
  shard(kS1, {"a"});
  index(R"({"weight_map": {"a": ")" + std::string(kS1) + R"(\u0000junk"}})");
  EXPECT_EQ(open_error(),
            idx() + ": tensor 'a' maps to \"" + kS1 + "\\u0000junk\": a shard name cannot contain a NUL character");
}

TEST_F(TensorStoreSharded, malformed_index) {
  index("{\"weight_map\": {");
  EXPECT_EQ(open_error(), idx() +
                              ": malformed JSON: parse error at line 1, column 17: syntax error while parsing "
                              "object key - unexpected end of input; expected string literal");
  index(R"({"metadata": {}})");
  EXPECT_EQ(open_error(),
            idx() + ": must be an object with a \"weight_map\" object mapping tensor names to shard files");
  index(R"([1])");
  EXPECT_EQ(open_error(),
            idx() + ": must be an object with a \"weight_map\" object mapping tensor names to shard files");
  index(R"({"weight_map": {"a": 3}})");
  EXPECT_EQ(open_error(), idx() + ": weight_map['a'] = 3: must be a shard file name");
  index(R"({"weight_map": {}})");
  EXPECT_EQ(open_error(), idx() + ": weight_map lists no tensors");
  index(R"({"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}})");
  EXPECT_EQ(open_error(), idx() + ": duplicate key 'a'");
}

TEST_F(TensorStoreSharded, broken_shard_is_named) {
  shard(kS1, {"a"});
  testing::write_file_bytes(dir_ / kS2, "abc");
  index(R"({"weight_map": {"a": ")" + std::string(kS1) + R"(", "c": ")" + kS2 + R"("}})");
  EXPECT_EQ(open_error(), path(kS2) + ": truncated: the file has 3 bytes, fewer than the 8-byte header length");
}

}  // namespace
}  // namespace genbridge::model
