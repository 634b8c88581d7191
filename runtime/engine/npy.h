#pragma once
// Output files (--dump-logits, --trace) and a minimal NumPy .npy (format version 1.0) writer for fp32
// matrices.
//
// How an output file is written, by what `path` names (symlinks followed):
//   - nothing yet, or a regular file: the bytes go to a temporary file in the same directory
//     (".<name>.tmp-XXXXXX"), which is synced and renamed over `path` only when every write, the sync
//     and the close succeeded. A failed write (disk full, I/O error) leaves no partial file and any
//     previous file untouched; a symlink keeps pointing at the (new) file.
//   - a character device or a FIFO (e.g. /dev/null, a named pipe another program reads): written
//     directly, since a rename would replace the device node or the pipe. Every write and the close are
//     still checked (/dev/full fails with ENOSPC). A FIFO nobody has open for reading is refused, never
//     waited on.
//   - anything else (a directory, a socket, a block device) is refused, and so is this process's own
//     standard output or standard error (results and log are printed there; a binary file in between
//     would be unreadable).
// Messages read "<label> <path>: <reason>", `label` being the flag the path came from ("--dump-logits").

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "genbridge/core/status.h"

namespace genbridge::engine {

// Checks, creating nothing, that `path` can be written as described above: it is not empty, not a
// directory or another refused type, and (unless it is a device or FIFO) its directory exists and is
// writable. InvalidArgument with the reason otherwise. Cheap (a few stat calls): run it before long work.
Status check_output_path(std::string_view label, const std::string& path);

// Writes the concatenation of `parts` to `path` as described above. InvalidArgument when the path is
// refused (check_output_path), Unavailable when a write, the sync, the close or the rename fails (the
// message carries the system's reason). Blocking file I/O.
Status write_output_file(std::string_view label, const std::string& path,
                         std::span<const std::span<const std::byte>> parts);

// Writes a little-endian float32 array of shape (rows, cols) to `path` (C order) with write_output_file.
// `data` holds rows*cols values.
Status write_npy_f32(const std::string& path, std::span<const float> data, int64_t rows, int64_t cols,
                     std::string_view label = "write_npy_f32");

}  // namespace genbridge::engine
