// IDX files (the MNIST container): a big-endian header of magic and dims, then unsigned bytes.
// Files come gzip-compressed (as distributed) or raw; both are read whole into memory, which for
// Fashion-MNIST is 47 MB.
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <system_error>
#include <vector>

#include "data/file_io.h"
#include "mantissa/core/error.h"
#include "mantissa/data/images.h"  // IdxArray, read_idx

namespace mantissa::data {
namespace {

// More than this many decompressed bytes is a corrupted file, not a dataset (MNIST-format files
// are tens of MB; this leaves room for larger ones like EMNIST).
constexpr size_t kMaxIdxBytes = size_t(4) << 30;

}  // namespace

std::vector<uint8_t> read_file(const std::string& path) {
  std::error_code ec;
  MT_CHECK(std::filesystem::exists(path, ec), "cannot read '", path, "': no such file");
  MT_CHECK(!std::filesystem::is_directory(path, ec), "cannot read '", path,
           "': it is a directory, not a file");
  std::FILE* f = std::fopen(path.c_str(), "rb");
  MT_CHECK(f != nullptr, "cannot open '", path, "': ", std::system_category().message(errno));
  std::vector<uint8_t> bytes;
  uint8_t chunk[1 << 16];
  size_t got = 0;
  while ((got = std::fread(chunk, 1, sizeof(chunk), f)) > 0)
    bytes.insert(bytes.end(), chunk, chunk + got);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  MT_CHECK(!failed, "error while reading '", path, "'");
  return bytes;
}

namespace {

bool is_gzip(const std::vector<uint8_t>& bytes) {
  return bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b;
}

// Every member of a gzip file, concatenated (as gunzip does). A stream that ends before its
// trailer is a truncated download.
std::vector<uint8_t> gunzip(const std::vector<uint8_t>& in, const std::string& path) {
  std::vector<uint8_t> out;
  // The trailer's ISIZE (size mod 2^32) of a well-formed single-member file is a good first
  // guess; a truncated file's last bytes are no trailer, so a guess far beyond any plausible
  // compression ratio is ignored (the buffer grows by doubling instead).
  size_t guess = in.size() * 4;
  if (in.size() >= 18) {
    const uint8_t* t = in.data() + in.size() - 4;
    const size_t isize = size_t(t[0]) | size_t(t[1]) << 8 | size_t(t[2]) << 16 | size_t(t[3]) << 24;
    if (isize > 0 && isize <= in.size() * 16 + (size_t(1) << 20)) guess = isize;
  }
  out.resize(std::min(guess, kMaxIdxBytes) + 1);  // + 1: never ask inflate for 0 bytes

  z_stream zs{};
  MT_CHECK(inflateInit2(&zs, 16 + MAX_WBITS) == Z_OK, "zlib could not initialise to read '", path,
           "'");
  size_t in_pos = 0;
  size_t out_pos = 0;
  int rc = Z_OK;
  std::string error;
  while (true) {
    // zlib counts in uInt: feed and drain at most 1 GiB at a time.
    constexpr size_t kStep = size_t(1) << 30;
    if (out_pos == out.size()) {
      if (out.size() > kMaxIdxBytes) {
        error = "it decompresses to more than " + std::to_string(kMaxIdxBytes >> 30) +
                " GiB: not an IDX file";
        break;
      }
      out.resize(std::min(out.size() * 2, kMaxIdxBytes + 1));
    }
    const size_t in_avail = std::min(in.size() - in_pos, kStep);
    const size_t out_avail = std::min(out.size() - out_pos, kStep);
    zs.next_in = const_cast<Bytef*>(in.data() + in_pos);
    zs.avail_in = uInt(in_avail);
    zs.next_out = out.data() + out_pos;
    zs.avail_out = uInt(out_avail);
    rc = inflate(&zs, Z_NO_FLUSH);
    in_pos += in_avail - zs.avail_in;
    out_pos += out_avail - zs.avail_out;
    if (rc == Z_STREAM_END) {
      if (in_pos == in.size()) break;
      // Another gzip member follows (or trailing padding, which gunzip also rejects).
      if (inflateReset(&zs) != Z_OK) {
        error = "zlib failed to reset between gzip members";
        break;
      }
      continue;
    }
    if (rc == Z_BUF_ERROR && zs.avail_out > 0) {
      // No progress is possible with output room left: the input ran out mid-stream.
      error = "the gzip stream ends early (truncated file: " + std::to_string(in.size()) +
              " compressed bytes, " + std::to_string(out_pos) + " bytes decompressed)";
      break;
    }
    if (rc != Z_OK && rc != Z_BUF_ERROR) {
      error = std::string("corrupt gzip data (") + (zs.msg ? zs.msg : zError(rc)) + ")";
      break;
    }
  }
  inflateEnd(&zs);
  MT_CHECK(error.empty(), "cannot read '", path, "': ", error);
  out.resize(out_pos);
  return out;
}

uint32_t be32(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

std::string dims_str(const std::vector<int64_t>& dims) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i)
    s += (i ? " x " : "") + std::to_string(dims[i]);
  return s;
}

}  // namespace

IdxArray read_idx(const std::string& path, int expected_dims) {
  MT_CHECK(expected_dims >= 1 && expected_dims <= 4, "read_idx: expected_dims must be 1..4, not ",
           expected_dims);
  std::vector<uint8_t> bytes = read_file(path);
  const bool gz = is_gzip(bytes);
  if (gz) bytes = gunzip(bytes, path);
  const char* kind = expected_dims == 1 ? "labels" : expected_dims == 3 ? "images" : "IDX";
  const uint32_t expected_magic = 0x00000800u | uint32_t(expected_dims);

  MT_CHECK(bytes.size() >= 4, "'", path, "' is not an IDX ", kind, " file: only ", bytes.size(),
           " bytes", gz ? " after decompression" : "", " (truncated or empty)");
  const uint32_t magic = be32(bytes.data());
  if (magic != expected_magic) {
    std::string what = "wrong magic number " + hex32(magic) + " (expected " +
                       hex32(expected_magic) + " for " + kind + ")";
    if ((magic & 0xffffff00u) == 0x00000800u)
      what += ": an IDX file of " + std::to_string(magic & 0xff) + " dims — images/labels swapped?";
    else if ((magic & 0xffff0000u) == 0 && (magic & 0xff00u) != 0x0800u)
      what += ": an IDX file whose elements are not unsigned bytes";
    else
      what += ": not an IDX file";
    MT_CHECK(false, "'", path, "': ", what);
  }
  const size_t header = 4 + 4 * size_t(expected_dims);
  MT_CHECK(bytes.size() >= header, "'", path, "' is truncated: ", bytes.size(),
           " bytes, shorter than its ", header, "-byte IDX header");

  IdxArray a;
  size_t count = 1;
  for (int d = 0; d < expected_dims; ++d) {
    const uint32_t n = be32(bytes.data() + 4 + 4 * d);
    a.dims.push_back(int64_t(n));
    MT_CHECK(n > 0, "'", path, "': dimension ", d, " of the IDX header is 0");
    MT_CHECK(count <= kMaxIdxBytes / n, "'", path, "': the IDX header's dims (", dims_str(a.dims),
             "...) describe more than ", kMaxIdxBytes >> 30, " GiB: corrupt header");
    count *= n;
  }
  const size_t payload = bytes.size() - header;
  MT_CHECK(payload >= count, "'", path, "' is truncated: its header says ", dims_str(a.dims), " = ",
           count, " bytes of data but only ", payload, " follow");
  MT_CHECK(payload == count, "'", path, "' has ", payload - count,
           " bytes after the data its header describes (", dims_str(a.dims), "): corrupt file");
  a.data.assign(bytes.begin() + std::ptrdiff_t(header), bytes.end());
  return a;
}

}  // namespace mantissa::data
