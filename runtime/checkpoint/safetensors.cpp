#include "runtime/checkpoint/safetensors.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "runtime/checkpoint/file_access.h"
#include "runtime/checkpoint/json_util.h"

namespace genbridge::model {
namespace {

using json = nlohmann::json;

struct DTypeInfo {
  std::string_view name;
  size_t size;
  std::optional<DType> dtype;  // the genbridge type, where one exists
};

// Every safetensors dtype with a whole-byte element size. (Sub-byte F4/F6 types are not handled.)
constexpr DTypeInfo kDTypes[] = {
    {"BOOL", 1, std::nullopt},
    {"U8", 1, DType::kU8},
    {"I8", 1, DType::kI8},
    {"F8_E5M2", 1, DType::kFp8E5M2},
    {"F8_E4M3", 1, DType::kFp8E4M3FN},
    {"F8_E8M0", 1, DType::kE8M0},
    {"I16", 2, std::nullopt},
    {"U16", 2, std::nullopt},
    {"F16", 2, DType::kF16},
    {"BF16", 2, DType::kBF16},
    {"I32", 4, DType::kI32},
    {"U32", 4, std::nullopt},
    {"F32", 4, DType::kF32},
    {"F64", 8, DType::kF64},
    {"I64", 8, DType::kI64},
    {"U64", 8, std::nullopt},
};

const DTypeInfo* find_dtype(std::string_view name) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string errno_text(int e) { return std::strerror(e); }

uint64_t read_le64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint64_t>(p[i]);
  return v;
}

void write_le64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

// A non-negative JSON integer.
bool as_u64(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

}  // namespace

// ---- MappedFile ----

Result<MappedFile> MappedFile::open(const std::filesystem::path& path, const MapOptions& options) {
  GB_ASSIGN_OR_RETURN(detail::RegularFile file, detail::RegularFile::open(path));
  const uint64_t size = file.size();
  if (size == 0) return MappedFile(nullptr, 0, options.use_mmap);
  if (!options.use_mmap) {
    // Anonymous memory the process owns (page-aligned; pre-faulted in one call, which is cheaper than
    // faulting page by page during the read), filled from the file, then made read-only like a mapping.
    // Reading in parallel gains nothing measurable: providing the fresh pages dominates (docs/model_loading.md).
    void* buf = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (buf == MAP_FAILED) {
      return resource_exhausted(
          fmt::format("{}: cannot allocate {} bytes to read the file into: {}", file.path(), size, errno_text(errno)));
    }
    MappedFile owned(static_cast<const std::byte*>(buf), size, false);
    GB_RETURN_IF_ERROR(file.read_exact(0, buf, size));
    ::mprotect(buf, size, PROT_READ);
    return owned;
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | (options.populate ? MAP_POPULATE : 0), file.fd(), 0);
  if (p == MAP_FAILED) {
    return resource_exhausted(fmt::format("{}: cannot memory-map {} bytes: {}", file.path(), size, errno_text(errno)));
  }
  return MappedFile(static_cast<const std::byte*>(p), size, true);  // the mapping keeps the file referenced
}

void MappedFile::release() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);  // a file mapping or the anonymous copy
  data_ = nullptr;
  size_ = 0;
}

MappedFile::MappedFile(MappedFile&& other) noexcept : data_(other.data_), size_(other.size_), mapped_(other.mapped_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    size_ = other.size_;
    mapped_ = other.mapped_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

MappedFile::~MappedFile() { release(); }

// ---- reader ----

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string_view safetensors_dtype_name(DType t) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.dtype && *d.dtype == t) return d.name;
  }
  return "";
}

size_t safetensors_dtype_size(std::string_view name) {
  const DTypeInfo* d = find_dtype(name);
  return d ? d->size : 0;
}

namespace {
// The 8-byte header length and the JSON header it announces (an object), checked against the file's size.
Result<json> parse_header(const MappedFile& map, const std::string& p, uint64_t* header_len_out) {
  const uint64_t size = map.size();
  if (size < 8) {
    return invalid_argument(
        fmt::format("{}: truncated: the file has {} bytes, fewer than the 8-byte header length", p, size));
  }
  const uint64_t header_len = read_le64(map.data());
  *header_len_out = header_len;
  if (header_len > size - 8) {
    return invalid_argument(fmt::format(
        "{}: header length {} runs past the end of the file ({} bytes after the 8-byte length; truncated file?)", p,
        header_len, size - 8));
  }
  if (header_len > kSafetensorsMaxHeaderBytes) {
    return invalid_argument(
        fmt::format("{}: header length {} exceeds the {}-byte limit", p, header_len, kSafetensorsMaxHeaderBytes));
  }
  const char* header = reinterpret_cast<const char*>(map.data() + 8);
  if (header_len == 0 || header[0] != '{') {
    return invalid_argument(fmt::format("{}: the header does not start with '{{' (not a safetensors file?)", p));
  }
  std::string error;
  // The format allows only spaces after the JSON (padding); the offsets in messages are file offsets.
  std::optional<json> parsed = detail::parse_json_strict(std::string_view(header, header_len), &error,
                                                         {.file_offset = 8, .padding = detail::JsonPadding::kSpaces});
  if (!parsed) return invalid_argument(fmt::format("{}: header: {}", p, error));
  if (!parsed->is_object()) return invalid_argument(fmt::format("{}: header: must be a JSON object", p));
  return std::move(*parsed);
}

// One tensor's header entry: dtype, shape and data_offsets, with the offsets inside the data section
// [data_begin, data_begin + data_size) and spanning exactly the bytes dtype and shape need.
Result<SafetensorsTensor> parse_tensor_entry(const std::string& p, const std::string& name, const json& entry,
                                             uint64_t data_begin, uint64_t data_size) {
  const auto bad = [&](const std::string& rule) {
    return invalid_argument(fmt::format("{}: tensor '{}': {}", p, name, rule));
  };
  if (!entry.is_object()) return bad("the header entry must be an object with dtype, shape and data_offsets");
  SafetensorsTensor t;
  t.name = name;
  const auto dt = entry.find("dtype");
  if (dt == entry.end() || !dt->is_string()) return bad("dtype must be a string");
  t.dtype = dt->get<std::string>();
  const DTypeInfo* info = find_dtype(t.dtype);
  if (!info) return bad(fmt::format("unknown or sub-byte dtype '{}'", t.dtype));
  const auto sh = entry.find("shape");
  if (sh == entry.end() || !sh->is_array()) return bad("shape must be a list of non-negative integers");
  if (sh->size() > static_cast<size_t>(kMaxRank)) {
    return bad(fmt::format("shape has rank {}; at most {} dimensions are supported", sh->size(), kMaxRank));
  }
  // numel * element size must not overflow: bound the running product of the non-zero dimensions by 2^62,
  // also when some dimension is 0 (views compute strides from the other dimensions).
  uint64_t bytes = info->size;
  bool overflow = false, empty = false;
  for (const json& d : *sh) {
    uint64_t v = 0;
    if (!as_u64(d, &v) || v > (uint64_t{1} << 62)) return bad("shape must be a list of non-negative integers");
    t.shape.push_back(static_cast<int64_t>(v));
    if (v == 0) {
      empty = true;
    } else if (bytes > (uint64_t{1} << 62) / v) {
      overflow = true;
    } else {
      bytes *= v;
    }
  }
  if (overflow) return bad(fmt::format("shape {} is too large", shape_string(t.shape)));
  if (empty) bytes = 0;
  const auto off = entry.find("data_offsets");
  uint64_t begin = 0, end = 0;
  if (off == entry.end() || !off->is_array() || off->size() != 2 || !as_u64((*off)[0], &begin) ||
      !as_u64((*off)[1], &end)) {
    return bad("data_offsets must be two non-negative integers [begin, end]");
  }
  if (end < begin) return bad(fmt::format("data_offsets [{}, {}] end before they begin", begin, end));
  if (end - begin != bytes) {
    return bad(fmt::format("data_offsets [{}, {}] span {} bytes but dtype {} and shape {} need {}", begin, end,
                           end - begin, t.dtype, shape_string(t.shape), bytes));
  }
  if (end > data_size) {
    return bad(fmt::format("data_offsets [{}, {}] run past the end of the data section ({} bytes; truncated file?)",
                           begin, end, data_size));
  }
  t.offset = data_begin + begin;
  t.nbytes = bytes;
  return t;
}

// The byte ranges must tile the data section [data_begin, size): sorted by offset, each starts where the
// previous ended.
Status check_tiling(const std::string& p, const std::vector<SafetensorsTensor>& tensors, uint64_t data_begin,
                    uint64_t size) {
  const uint64_t data_size = size - data_begin;
  std::vector<const SafetensorsTensor*> by_offset;
  for (const SafetensorsTensor& t : tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const SafetensorsTensor* a, const SafetensorsTensor* b) {
    return a->offset != b->offset ? a->offset < b->offset : a->nbytes < b->nbytes;
  });
  uint64_t cursor = data_begin;
  const SafetensorsTensor* prev = nullptr;
  const auto range = [&](const SafetensorsTensor* t) {
    return fmt::format("'{}' [{}, {}]", t->name, t->offset - data_begin, t->offset - data_begin + t->nbytes);
  };
  for (const SafetensorsTensor* t : by_offset) {
    if (t->offset < cursor) {
      return invalid_argument(fmt::format("{}: tensors {} and {} overlap", p, range(prev), range(t)));
    }
    if (t->offset > cursor) {
      return invalid_argument(fmt::format("{}: bytes [{}, {}) of the data section belong to no tensor (before {})", p,
                                          cursor - data_begin, t->offset - data_begin, range(t)));
    }
    cursor = t->offset + t->nbytes;
    prev = t;
  }
  if (cursor != size) {
    return invalid_argument(fmt::format("{}: the data section has {} bytes but the tensors cover only {}", p, data_size,
                                        cursor - data_begin));
  }
  return ok_status();
}
}  // namespace

Result<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path, const MapOptions& options) {
  const std::string p = path.string();
  GB_ASSIGN_OR_RETURN(MappedFile map, MappedFile::open(path, options));
  uint64_t header_len = 0;
  GB_ASSIGN_OR_RETURN(json header, parse_header(map, p, &header_len));
  const uint64_t size = map.size();
  const uint64_t data_begin = 8 + header_len;
  const uint64_t data_size = size - data_begin;
  SafetensorsFile file;
  file.path_ = p;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return invalid_argument(fmt::format("{}: __metadata__ must be an object of strings", p));
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) {
          return invalid_argument(
              fmt::format("{}: __metadata__ '{}' = {}: values must be strings", p, k, detail::json_excerpt(v)));
        }
        file.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    GB_ASSIGN_OR_RETURN(SafetensorsTensor t, parse_tensor_entry(p, name, entry, data_begin, data_size));
    file.tensors_.push_back(std::move(t));
  }

  GB_RETURN_IF_ERROR(check_tiling(p, file.tensors_, data_begin, size));
  // nlohmann's object keeps keys sorted, so tensors_ is already sorted by name.
  file.map_ = std::make_unique<MappedFile>(std::move(map));
  return file;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const SafetensorsTensor& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

Result<TensorView> SafetensorsFile::view(const SafetensorsTensor& t) const {
  const DTypeInfo* info = find_dtype(t.dtype);
  if (!info || !info->dtype ||
      (*info->dtype != DType::kBF16 && *info->dtype != DType::kF16 && *info->dtype != DType::kF32)) {
    return invalid_argument(
        fmt::format("{}: tensor '{}' has dtype {}; genbridge reads BF16, F16 and F32 tensors", path_, t.name, t.dtype));
  }
  if (t.offset % info->size != 0 && t.nbytes != 0) {
    return invalid_argument(fmt::format("{}: tensor '{}' starts at file offset {}, not aligned to its {}-byte elements",
                                        path_, t.name, t.offset, info->size));
  }
  // Read-only mapping: the view's non-const pointer must never be written through.
  void* data = const_cast<std::byte*>(map_->data() + t.offset);
  return TensorView(data, *info->dtype, t.shape.data(), static_cast<int>(t.shape.size()));
}

Result<TensorView> SafetensorsFile::view(std::string_view name) const {
  const SafetensorsTensor* t = find(name);
  if (!t) return invalid_argument(fmt::format("{}: no tensor named '{}'", path_, name));
  return view(*t);
}

// ---- writer ----

Result<SafetensorsWriter> SafetensorsWriter::create(const std::filesystem::path& path,
                                                    std::vector<SafetensorsTensorSpec> specs,
                                                    const std::map<std::string, std::string>& metadata) {
  const std::string p = path.string();
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  std::vector<uint64_t> nbytes;
  uint64_t offset = 0;
  for (const SafetensorsTensorSpec& s : specs) {
    const std::string_view dt = safetensors_dtype_name(s.dtype);
    if (dt.empty()) {
      return invalid_argument(
          fmt::format("{}: tensor '{}': dtype {} has no safetensors code", p, s.name, dtype_name(s.dtype)));
    }
    if (s.name.empty() || s.name == "__metadata__" || !names.insert(s.name).second) {
      return invalid_argument(fmt::format("{}: tensor name '{}' is empty, reserved or repeated", p, s.name));
    }
    uint64_t n = safetensors_dtype_size(dt);
    for (int64_t d : s.shape) {
      if (d < 0) return invalid_argument(fmt::format("{}: tensor '{}' has a negative dimension", p, s.name));
      n *= static_cast<uint64_t>(d);
    }
    if (offset % safetensors_dtype_size(dt) != 0 && n != 0) {
      return invalid_argument(fmt::format(
          "{}: tensor '{}' would start at data offset {}, not a multiple of its {}-byte elements (write tensors "
          "with larger elements first)",
          p, s.name, offset, safetensors_dtype_size(dt)));
    }
    header[s.name] = {{"dtype", std::string(dt)}, {"shape", s.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
    nbytes.push_back(n);
  }
  std::string text = header.dump();
  // Pad with spaces so the data section starts on a 64-byte boundary (8-byte length + header).
  text.append((64 - (8 + text.size()) % 64) % 64, ' ');

  SafetensorsWriter w;
  w.path_ = path;
  w.tmp_path_ = path;
  w.tmp_path_ += ".tmp";
  w.specs_ = std::move(specs);
  w.nbytes_ = std::move(nbytes);
  w.file_ = std::fopen(w.tmp_path_.c_str(), "wb");
  if (!w.file_) return invalid_argument(fmt::format("{}: cannot create: {}", w.tmp_path_.string(), errno_text(errno)));
  unsigned char len[8];
  write_le64(len, text.size());
  if (std::fwrite(len, 1, 8, w.file_) != 8 || std::fwrite(text.data(), 1, text.size(), w.file_) != text.size()) {
    return internal_error(fmt::format("{}: write failed: {}", w.tmp_path_.string(), errno_text(errno)));
  }
  return w;
}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&& o) noexcept
    : path_(std::move(o.path_)),
      tmp_path_(std::move(o.tmp_path_)),
      specs_(std::move(o.specs_)),
      nbytes_(std::move(o.nbytes_)),
      next_(o.next_),
      file_(o.file_) {
  o.file_ = nullptr;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (file_) {
    std::fclose(file_);
    std::error_code ec;
    std::filesystem::remove(tmp_path_, ec);
  }
}

Status SafetensorsWriter::write_next(const void* data, size_t nbytes) {
  if (!file_) return internal_error(fmt::format("{}: writer is closed", path_.string()));
  if (next_ >= specs_.size()) {
    return invalid_argument(fmt::format("{}: all {} tensors were already written", path_.string(), specs_.size()));
  }
  if (nbytes != nbytes_[next_]) {
    return invalid_argument(fmt::format("{}: tensor '{}' needs {} bytes, got {}", path_.string(), specs_[next_].name,
                                        nbytes_[next_], nbytes));
  }
  if (nbytes != 0 && std::fwrite(data, 1, nbytes, file_) != nbytes) {
    return internal_error(fmt::format("{}: write failed: {}", tmp_path_.string(), errno_text(errno)));
  }
  ++next_;
  return ok_status();
}

Status SafetensorsWriter::finish() {
  if (!file_) return internal_error(fmt::format("{}: writer is closed", path_.string()));
  if (next_ != specs_.size()) {
    return invalid_argument(
        fmt::format("{}: only {} of {} tensors were written", path_.string(), next_, specs_.size()));
  }
  const bool ok = std::fflush(file_) == 0 && std::fclose(file_) == 0;
  file_ = nullptr;
  if (!ok) return internal_error(fmt::format("{}: write failed: {}", tmp_path_.string(), errno_text(errno)));
  std::error_code ec;
  std::filesystem::rename(tmp_path_, path_, ec);
  if (ec) return internal_error(fmt::format("{}: cannot rename into place: {}", path_.string(), ec.message()));
  return ok_status();
}

Status write_safetensors(const std::filesystem::path& path, const std::vector<SafetensorsTensorData>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  // Larger elements first (stable) keeps every tensor aligned to its element size, as the reference
  // implementation does.
  std::vector<const SafetensorsTensorData*> order;
  for (const SafetensorsTensorData& t : tensors) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [](const SafetensorsTensorData* a, const SafetensorsTensorData* b) {
    return dtype_size(a->spec.dtype) > dtype_size(b->spec.dtype);
  });
  std::vector<SafetensorsTensorSpec> specs;
  for (const SafetensorsTensorData* t : order) specs.push_back(t->spec);
  GB_ASSIGN_OR_RETURN(SafetensorsWriter w, SafetensorsWriter::create(path, std::move(specs), metadata));
  for (const SafetensorsTensorData* tp : order) {
    const SafetensorsTensorData& t = *tp;
    uint64_t n = safetensors_dtype_size(safetensors_dtype_name(t.spec.dtype));
    for (int64_t d : t.spec.shape) n *= static_cast<uint64_t>(d);
    GB_RETURN_IF_ERROR(w.write_next(t.data, n));
  }
  return w.finish();
}

}  // namespace genbridge::model
