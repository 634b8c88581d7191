// Safetensors reader and writer: bit-exact round trips, the on-disk layout the format specifies, and every
// malformed-file rule with its exact message (files crafted byte by byte in a temp dir).
#include "runtime/checkpoint/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "genbridge/core/formats.h"
#include "support/deadline.h"
#include "support/temp_dir.h"

namespace genbridge::model {
namespace {

using testing::TempDir;

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// A file from a header text and data bytes (the header is used as given: no padding).
std::string craft(const std::string& header, const std::string& data) { return le64(header.size()) + header + data; }

class SafetensorsBroken : public ::testing::Test {
 protected:
  // Writes `bytes` to a file and returns the open error message ("" if it opened).
  std::string open_error(const std::string& bytes) {
    testing::write_file_bytes(path(), bytes);
    Result<SafetensorsFile> f = SafetensorsFile::open(path());
    if (f.ok()) return "";
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
    return f.status().message();
  }
  std::string path() const { return (dir_ / "m.safetensors").string(); }
  std::string err(const std::string& rule) const { return path() + ": " + rule; }
  TempDir dir_;
};

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

TEST(Safetensors, round_trip_is_bit_exact) {
  TempDir dir;
  // Random bytes cover every bit pattern class (NaNs, infinities, subnormals, negative zero).
  const std::vector<uint8_t> bf = random_bytes(3 * 5 * 2, 1), hf = random_bytes(7 * 2, 2),
                             f32 = random_bytes(2 * 3 * 4 * 4, 3), u8 = random_bytes(3, 4);
  const std::vector<SafetensorsTensorData> tensors = {
      {{"w.bf16", DType::kBF16, {3, 5}}, bf.data()},   {{"a.f16", DType::kF16, {7}}, hf.data()},
      {{"z.f32", DType::kF32, {2, 3, 4}}, f32.data()}, {{"odd.u8", DType::kU8, {3}}, u8.data()},
      {{"empty", DType::kF32, {0, 4}}, nullptr},       {{"scalar", DType::kF32, {}}, f32.data()},
  };
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "round trip"}};
  ASSERT_TRUE(write_safetensors(dir / "m.safetensors", tensors, meta).ok());
  EXPECT_FALSE(std::filesystem::exists(dir / "m.safetensors.tmp"));

  Result<SafetensorsFile> f = SafetensorsFile::open(dir / "m.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->metadata(), meta);
  ASSERT_EQ(f->tensors().size(), 6u);
  std::vector<std::string> names;
  for (const SafetensorsTensor& t : f->tensors()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"a.f16", "empty", "odd.u8", "scalar", "w.bf16", "z.f32"}));

  const auto check = [&](const char* name, DType dt, std::vector<int64_t> shape, const std::vector<uint8_t>& src,
                         size_t nbytes) {
    Result<TensorView> v = f->view(name);
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    EXPECT_EQ(v->dtype(), dt) << name;
    EXPECT_EQ(std::vector<int64_t>(v->shape(), v->shape() + v->rank()), shape) << name;
    EXPECT_TRUE(v->is_contiguous());
    EXPECT_EQ(std::memcmp(v->data(), src.data(), nbytes), 0) << name;
    // Zero-copy: the view points into the mapping, at the tensor's file offset.
    EXPECT_EQ(static_cast<const std::byte*>(v->data()), f->mapping().data() + f->find(name)->offset) << name;
  };
  check("w.bf16", DType::kBF16, {3, 5}, bf, bf.size());
  check("a.f16", DType::kF16, {7}, hf, hf.size());
  check("z.f32", DType::kF32, {2, 3, 4}, f32, f32.size());
  check("scalar", DType::kF32, {}, f32, 4);
  Result<TensorView> e = f->view("empty");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->numel(), 0);
  EXPECT_EQ(f->find("odd.u8")->nbytes, 3u);
}

TEST(Safetensors, writer_produces_the_specified_layout) {
  TempDir dir;
  const float v[2] = {1.0f, -2.0f};
  ASSERT_TRUE(write_safetensors(dir / "m.safetensors", {{{"a", DType::kF32, {2}}, v}}, {{"format", "pt"}}).ok());
  const std::vector<char> bytes = testing::read_file_bytes(dir / "m.safetensors");
  const std::string header = R"({"__metadata__":{"format":"pt"},"a":{"data_offsets":[0,8],"dtype":"F32","shape":[2]}})";
  const size_t padded = 120;  // 8 + 120 = 128: the data section starts on a 64-byte boundary
  ASSERT_EQ(bytes.size(), 8 + padded + 8);
  EXPECT_EQ(std::string(bytes.data(), 8), le64(padded));
  EXPECT_EQ(std::string(bytes.data() + 8, header.size()), header);
  EXPECT_EQ(std::string(bytes.data() + 8 + header.size(), padded - header.size()),
            std::string(padded - header.size(), ' '));
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + padded, v, 8), 0);
}

TEST_F(SafetensorsBroken, reads_a_hand_made_file) {
  // Exactly what the format specifies, written without our writer: 8-byte-aligned header, two tensors.
  std::string header = R"({"b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},)"
                       R"("a":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  float a[2] = {0.5f, 3.0f};
  uint16_t b[2] = {0x3f80, 0xc000};  // bf16 1.0, -2.0
  std::string data(reinterpret_cast<char*>(a), 8);
  data.append(reinterpret_cast<char*>(b), 4);
  testing::write_file_bytes(path(), craft(header, data));
  Result<SafetensorsFile> f = SafetensorsFile::open(path());
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_TRUE(f->metadata().empty());
  TensorView va = f->view("a").value(), vb = f->view("b").value();
  EXPECT_EQ(va.dim(0), 1);
  EXPECT_EQ(va.dim(1), 2);
  EXPECT_EQ(va.data_as<const float>()[1], 3.0f);
  EXPECT_EQ(bf16_to_float(vb.data_as<const bf16_t>()[1]), -2.0f);
}

TEST_F(SafetensorsBroken, missing_file) {
  EXPECT_EQ(SafetensorsFile::open(dir_ / "nope.safetensors").status().message(),
            (dir_ / "nope.safetensors").string() + ": cannot open: No such file or directory");
}

TEST_F(SafetensorsBroken, directory_instead_of_file) {
  EXPECT_EQ(SafetensorsFile::open(dir_.path()).status().message(),
            dir_.path().string() + ": is a directory, not a regular file");
}

TEST_F(SafetensorsBroken, truncated_before_header_length) {
  EXPECT_EQ(open_error(""), err("truncated: the file has 0 bytes, fewer than the 8-byte header length"));
  EXPECT_EQ(open_error(std::string("\x10\x00\x00", 3)),
            err("truncated: the file has 3 bytes, fewer than the 8-byte header length"));
}

TEST_F(SafetensorsBroken, header_length_beyond_file) {
  EXPECT_EQ(open_error(le64(100) + "{}"),
            err("header length 100 runs past the end of the file (2 bytes after the 8-byte length; truncated file?)"));
  EXPECT_EQ(open_error(le64(~uint64_t{0}) + "{}"),
            err("header length 18446744073709551615 runs past the end of the file (2 bytes after the 8-byte length; "
                "truncated file?)"));
}

TEST_F(SafetensorsBroken, header_over_limit) {
  // A sparse file: the size is real, no blocks are written.
  const uint64_t len = kSafetensorsMaxHeaderBytes + 1;
  testing::write_file_bytes(path(), le64(len) + "{");
  ASSERT_EQ(::truncate(path().c_str(), static_cast<off_t>(8 + len)), 0);
  EXPECT_EQ(SafetensorsFile::open(path()).status().message(),
            err("header length 104857601 exceeds the 104857600-byte limit"));
}

TEST_F(SafetensorsBroken, header_not_json_object) {
  EXPECT_EQ(open_error(craft("", "")), err("the header does not start with '{' (not a safetensors file?)"));
  EXPECT_EQ(open_error(craft(" {}", "")), err("the header does not start with '{' (not a safetensors file?)"));
  EXPECT_EQ(open_error(craft("[1, 2]", "")), err("the header does not start with '{' (not a safetensors file?)"));
}

TEST_F(SafetensorsBroken, malformed_json) {
  EXPECT_EQ(open_error(craft(R"({"a": {"dtype": "F32", )", "")),
            err("header: malformed JSON: parse error at line 1, column 24: syntax error while parsing object key - "
                "unexpected end of input; expected string literal"));
  // A complete object followed by more text: the first byte after it is named with its file offset.
  EXPECT_EQ(open_error(craft("{}}", "")),
            err("header: unexpected '}' (0x7d) at byte offset 10 after the end of the JSON object; only spaces "
                "(0x20) may follow it"));
}

TEST_F(SafetensorsBroken, duplicate_tensor_in_header) {
  // JSON parsers keep one of two equal keys silently; two entries would alias one name.
  EXPECT_EQ(open_error(craft(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                             R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                             "xy")),
            err("header: duplicate key 'a'"));
}

TEST_F(SafetensorsBroken, bad_metadata) {
  EXPECT_EQ(open_error(craft(R"({"__metadata__": [1]})", "")), err("__metadata__ must be an object of strings"));
  EXPECT_EQ(open_error(craft(R"({"__metadata__": {"format": 3}})", "")),
            err("__metadata__ 'format' = 3: values must be strings"));
}

TEST_F(SafetensorsBroken, bad_entries) {
  const auto entry = [&](const std::string& body, const std::string& data = "") {
    return open_error(craft(R"({"t": )" + body + "}", data));
  };
  EXPECT_EQ(entry("[]"), err("tensor 't': the header entry must be an object with dtype, shape and data_offsets"));
  EXPECT_EQ(entry(R"({"shape":[1],"data_offsets":[0,4]})", "abcd"), err("tensor 't': dtype must be a string"));
  EXPECT_EQ(entry(R"({"dtype":4,"shape":[1],"data_offsets":[0,4]})", "abcd"),
            err("tensor 't': dtype must be a string"));
  EXPECT_EQ(entry(R"({"dtype":"Q8","shape":[1],"data_offsets":[0,1]})", "a"),
            err("tensor 't': unknown or sub-byte dtype 'Q8'"));
  EXPECT_EQ(entry(R"({"dtype":"F4","shape":[2],"data_offsets":[0,1]})", "a"),
            err("tensor 't': unknown or sub-byte dtype 'F4'"));
  EXPECT_EQ(entry(R"({"dtype":"F32","data_offsets":[0,4]})", "abcd"),
            err("tensor 't': shape must be a list of non-negative integers"));
  EXPECT_EQ(entry(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})", "abcd"),
            err("tensor 't': shape must be a list of non-negative integers"));
  EXPECT_EQ(entry(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})", "abcd"),
            err("tensor 't': shape must be a list of non-negative integers"));
  EXPECT_EQ(entry(R"({"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]})", "abcd"),
            err("tensor 't': shape has rank 9; at most 8 dimensions are supported"));
  EXPECT_EQ(entry(R"({"dtype":"F32","shape":[4611686018427387904, 4],"data_offsets":[0,4]})", "abcd"),
            err("tensor 't': shape [4611686018427387904, 4] is too large"));
  EXPECT_EQ(entry(R"({"dtype":"F32","shape":[1]})", "abcd"),
            err("tensor 't': data_offsets must be two non-negative integers [begin, end]"));
  EXPECT_EQ(entry(R"({"dtype":"F32","shape":[1],"data_offsets":[0]})", "abcd"),
            err("tensor 't': data_offsets must be two non-negative integers [begin, end]"));
  EXPECT_EQ(entry(R"({"dtype":"F32","shape":[1],"data_offsets":[-4,0]})", "abcd"),
            err("tensor 't': data_offsets must be two non-negative integers [begin, end]"));
}

TEST_F(SafetensorsBroken, offsets_end_before_begin) {
  EXPECT_EQ(open_error(craft(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", "abcd")),
            err("tensor 't': data_offsets [4, 0] end before they begin"));
}

TEST_F(SafetensorsBroken, offsets_do_not_match_shape_and_dtype) {
  EXPECT_EQ(open_error(craft(R"({"t":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,6]}})", "abcdef")),
            err("tensor 't': data_offsets [0, 6] span 6 bytes but dtype BF16 and shape [2, 2] need 8"));
}

TEST_F(SafetensorsBroken, offsets_out_of_range_truncated_data) {
  EXPECT_EQ(open_error(craft(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", "abcdefgh")),
            err("tensor 't': data_offsets [0, 16] run past the end of the data section (8 bytes; truncated file?)"));
}

TEST_F(SafetensorsBroken, overlapping_tensors) {
  EXPECT_EQ(open_error(craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                             "abcdefghijkl")),
            err("tensors 'a' [0, 8] and 'b' [4, 12] overlap"));
}

TEST_F(SafetensorsBroken, gap_between_tensors) {
  EXPECT_EQ(open_error(craft(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                             "abcdefghijkl")),
            err("bytes [4, 8) of the data section belong to no tensor (before 'b' [8, 12])"));
  EXPECT_EQ(open_error(craft(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", "abcdefgh")),
            err("bytes [0, 4) of the data section belong to no tensor (before 'a' [4, 8])"));
}

TEST_F(SafetensorsBroken, trailing_bytes) {
  EXPECT_EQ(open_error(craft(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "abcdefgh")),
            err("the data section has 8 bytes but the tensors cover only 4"));
  EXPECT_EQ(open_error(craft("{}", "x")), err("the data section has 1 bytes but the tensors cover only 0"));
}

TEST_F(SafetensorsBroken, unsupported_dtype_is_refused_on_view) {
  // The file is valid; only asking for the I64 tensor as a float view fails.
  testing::write_file_bytes(path(),
                            craft(R"({"ids":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0')));
  Result<SafetensorsFile> f = SafetensorsFile::open(path());
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->view("ids").status().message(),
            err("tensor 'ids' has dtype I64; genbridge reads BF16, F16 and F32 tensors"));
  EXPECT_EQ(f->view("nope").status().message(), err("no tensor named 'nope'"));
}

TEST_F(SafetensorsBroken, misaligned_tensor_is_refused_on_view) {
  // Header of 8 bytes: data starts at file offset 16; the F32 tensor sits at data offset 2 (file offset 18).
  std::string header = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  testing::write_file_bytes(path(), craft(header, "abcdef"));
  Result<SafetensorsFile> f = SafetensorsFile::open(path());
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->view("b").status().message(),
            err("tensor 'b' starts at file offset " + std::to_string(8 + header.size() + 2) +
                ", not aligned to its 4-byte elements"));
}

TEST_F(SafetensorsBroken, populate_maps_the_same_bytes) {
  const float v[3] = {1.f, 2.f, 3.f};
  ASSERT_TRUE(write_safetensors(path(), {{{"a", DType::kF32, {3}}, v}}).ok());
  Result<SafetensorsFile> f = SafetensorsFile::open(path(), MapOptions{.populate = true});
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->view("a")->data_as<const float>()[2], 3.f);
}

TEST_F(SafetensorsBroken, nul_byte_after_the_header_json) {
  // nlohmann's parser takes NUL for the end of input: "{...}\0garbage" used to load.
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  EXPECT_EQ(open_error(craft(header + std::string("\0garbage", 8), "abcd")),
            err("header: NUL byte (0x00) at byte offset " + std::to_string(8 + header.size()) +
                "; JSON text cannot contain one"));
  // NUL padding is not space padding either.
  EXPECT_EQ(open_error(craft(header + std::string(3, '\0'), "abcd")),
            err("header: NUL byte (0x00) at byte offset " + std::to_string(8 + header.size()) +
                "; JSON text cannot contain one"));
}

TEST_F(SafetensorsBroken, garbage_after_the_header_json) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  const std::string at = std::to_string(8 + header.size() + 2);
  EXPECT_EQ(open_error(craft(header + "  garbage", "abcd")),
            err("header: unexpected 'g' (0x67) at byte offset " + at +
                " after the end of the JSON object; only spaces (0x20) may follow it"));
  // The format pads with spaces (0x20) only; other JSON whitespace is refused too.
  EXPECT_EQ(open_error(craft(header + "  \n", "abcd")),
            err("header: unexpected byte 0x0a at byte offset " + at +
                " after the end of the JSON object; only spaces (0x20) may follow it"));
  EXPECT_EQ(open_error(craft(header + "\t", "abcd")),
            err("header: unexpected byte 0x09 at byte offset " + std::to_string(8 + header.size()) +
                " after the end of the JSON object; only spaces (0x20) may follow it"));
  // Space padding is the format's and loads.
  testing::write_file_bytes(path(), craft(header + "       ", "abcd"));
  EXPECT_TRUE(SafetensorsFile::open(path()).ok());
}

TEST_F(SafetensorsBroken, braces_inside_strings_do_not_end_the_header) {
  // Only brackets outside strings close the object: a name with '}' and an escaped quote still loads.
  const std::string header = R"({"a}\"]":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}   )";
  testing::write_file_bytes(path(), craft(header, "abcd"));
  Result<SafetensorsFile> f = SafetensorsFile::open(path());
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->tensors()[0].name, "a}\"]");
}

TEST_F(SafetensorsBroken, zero_dimension_does_not_hide_an_overflowing_shape) {
  // numel is 0, but a view's strides would multiply the other dimensions (signed overflow).
  EXPECT_EQ(open_error(craft(R"({"t":{"dtype":"F32","shape":[0,4611686018427387904,4],"data_offsets":[0,0]}})", "")),
            err("tensor 't': shape [0, 4611686018427387904, 4] is too large"));
  // A zero dimension with sane others is an empty tensor.
  testing::write_file_bytes(path(), craft(R"({"t":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]}})", ""));
  EXPECT_TRUE(SafetensorsFile::open(path()).ok());
}

TEST_F(SafetensorsBroken, offsets_at_the_integer_limits) {
  EXPECT_EQ(open_error(craft(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,18446744073709551615]}})", "abcd")),
            err("tensor 't': data_offsets [0, 18446744073709551615] span 18446744073709551615 bytes but dtype F32 and "
                "shape [1] need 4"));
  EXPECT_EQ(open_error(craft(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,)"
                             R"(18446744073709551616]}})",
                             "abcd")),
            err("tensor 't': data_offsets must be two non-negative integers [begin, end]"));
  EXPECT_EQ(open_error(craft(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551611,)"
                             R"(18446744073709551615]}})",
                             "abcd")),
            err("tensor 't': data_offsets [18446744073709551611, 18446744073709551615] run past the end of the data "
                "section (4 bytes; truncated file?)"));
}

TEST_F(SafetensorsBroken, fifo_is_refused_without_blocking) {
  ASSERT_EQ(::mkfifo(path().c_str(), 0600), 0);
  // Before the fix open() blocked forever here (no writer); now it is refused after a stat.
  const Status st = testing::call_with_deadline([&] { return SafetensorsFile::open(path()).status(); }, {path()});
  EXPECT_EQ(st.message(), err("is a FIFO (named pipe), not a regular file"));
}

TEST_F(SafetensorsBroken, read_into_memory_gives_the_same_bytes) {
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.25f;
  const uint16_t b[3] = {0x3f80, 0x7f80, 0xffc1};
  ASSERT_TRUE(
      write_safetensors(path(), {{{"f", DType::kF32, {10, 100}}, v.data()}, {{"b", DType::kBF16, {3}}, b}}).ok());
  Result<SafetensorsFile> mapped = SafetensorsFile::open(path());
  Result<SafetensorsFile> read = SafetensorsFile::open(path(), MapOptions{.use_mmap = false});
  ASSERT_TRUE(mapped.ok() && read.ok()) << read.status().to_string();
  EXPECT_TRUE(mapped->mapping().is_mapped());
  EXPECT_FALSE(read->mapping().is_mapped());
  ASSERT_EQ(read->file_size(), mapped->file_size());
  EXPECT_EQ(std::memcmp(read->mapping().data(), mapped->mapping().data(), read->file_size()), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(read->mapping().data()) % 64, 0u);
  EXPECT_EQ(read->view("f")->data_as<const float>()[999], 249.75f);
  EXPECT_EQ(read->view("b")->data_as<const uint16_t>()[2], 0xffc1);
  // The copy is the process's own: truncating the file does not touch it.
  ASSERT_EQ(::truncate(path().c_str(), 0), 0);
  EXPECT_EQ(read->view("f")->data_as<const float>()[999], 249.75f);
}

TEST(SafetensorsWriter, refuses_bad_specs_and_sizes) {
  TempDir dir;
  const std::string p = (dir / "w.safetensors").string();
  EXPECT_EQ(SafetensorsWriter::create(p, {{"a", DType::kF32, {1}}, {"a", DType::kF32, {1}}}).status().message(),
            p + ": tensor name 'a' is empty, reserved or repeated");
  EXPECT_EQ(SafetensorsWriter::create(p, {{"__metadata__", DType::kF32, {1}}}).status().message(),
            p + ": tensor name '__metadata__' is empty, reserved or repeated");
  EXPECT_EQ(SafetensorsWriter::create(p, {{"q", DType::kFp4E2M1x2, {1}}}).status().message(),
            p + ": tensor 'q': dtype fp4_e2m1x2 has no safetensors code");
  EXPECT_EQ(SafetensorsWriter::create(p, {{"b", DType::kU8, {3}}, {"f", DType::kF32, {1}}}).status().message(),
            p + ": tensor 'f' would start at data offset 3, not a multiple of its 4-byte elements (write tensors with "
                "larger elements first)");
  {
    Result<SafetensorsWriter> w = SafetensorsWriter::create(p, {{"a", DType::kF32, {2}}, {"b", DType::kBF16, {1}}});
    ASSERT_TRUE(w.ok());
    const float v[2] = {1.f, 2.f};
    EXPECT_EQ(w->write_next(v, 4).message(), p + ": tensor 'a' needs 8 bytes, got 4");
    EXPECT_TRUE(w->write_next(v, 8).ok());
    EXPECT_EQ(w->finish().message(), p + ": only 1 of 2 tensors were written");
  }
  // An unfinished writer leaves neither the file nor its temporary behind.
  EXPECT_FALSE(std::filesystem::exists(p));
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));
}

}  // namespace
}  // namespace genbridge::model
