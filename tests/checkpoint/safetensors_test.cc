#include "checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/mapped_file.h"
#include "tests/checkpoint/checkpoint_testing.h"
#include "tests/status_testing.h"

namespace prl {
namespace {

using ::prl::testing::IsError;
using ::prl::testing::SafetensorsBytes;
using ::prl::testing::ScopedTempDir;

constexpr absl::string_view kSource = "weights/model.safetensors";
constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

absl::StatusOr<SafetensorsHeader> Parse(const std::vector<uint8_t>& bytes) {
  return ParseSafetensorsHeader(bytes, kSource);
}

// ---- Rejected headers ----------------------------------------------------------------------

TEST(ParseSafetensorsHeaderTest, FileShorterThanEightBytesIsAnErrorNamingTheFile) {
  const std::vector<uint8_t> bytes = {1, 0, 0, 0, 0};
  EXPECT_TRUE(IsError(Parse(bytes).status(), kInvalid, {kSource, "truncated", "5 bytes"}));
  EXPECT_TRUE(IsError(Parse({}).status(), kInvalid, {kSource, "0 bytes"}));
}

TEST(ParseSafetensorsHeaderTest, HeaderLengthPastTheEndOfTheFileIsAnError) {
  const std::string header = R"({})";
  const auto bytes = SafetensorsBytes(1000, header, {});  // 10-byte file claiming 1000
  EXPECT_TRUE(IsError(Parse(bytes).status(), kInvalid,
                      {kSource, "header length 1000", "past the end of the file (10 bytes)"}));
  // A length that would wrap around if added to 8 is caught too.
  const auto huge = SafetensorsBytes(~uint64_t{0}, header, {});
  EXPECT_TRUE(IsError(Parse(huge).status(), kInvalid, {kSource, "past the end"}));
}

TEST(ParseSafetensorsHeaderTest, HeaderLengthOverTheLimitIsAnErrorEvenWithinTheFile) {
  const uint64_t len = kMaxSafetensorsHeaderBytes + 1;
  std::vector<uint8_t> bytes(8 + len, ' ');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(len >> (8 * i));
  EXPECT_TRUE(IsError(Parse(bytes).status(), kInvalid,
                      {kSource, absl::StrCat("header length ", len), "exceeds the limit"}));
}

TEST(ParseSafetensorsHeaderTest, MalformedJsonIsAnError) {
  EXPECT_TRUE(IsError(Parse(SafetensorsBytes(R"({"a": {"dtype": "F32",)")).status(), kInvalid,
                      {kSource, "malformed header JSON"}));
}

TEST(ParseSafetensorsHeaderTest, TopLevelValueThatIsNotAnObjectIsAnError) {
  for (const char* header : {"[]", "3", R"("F32")", "null"}) {
    SCOPED_TRACE(header);
    EXPECT_TRUE(IsError(Parse(SafetensorsBytes(header)).status(), kInvalid,
                        {kSource, "expected a JSON object"}));
  }
}

TEST(ParseSafetensorsHeaderTest, DuplicateTensorNameIsAnErrorNamingIt) {
  const auto bytes = SafetensorsBytes(R"({
    "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
    "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                                      8);
  EXPECT_TRUE(IsError(Parse(bytes).status(), kInvalid, {kSource, "duplicate key 'w'"}));
}

TEST(ParseSafetensorsHeaderTest, DuplicateKeyInsideATensorEntryIsAnError) {
  // nlohmann would silently keep the last "dtype".
  const auto bytes = SafetensorsBytes(
      R"({"w": {"dtype": "F32", "dtype": "I8", "shape": [1], "data_offsets": [0, 4]}})", 4);
  EXPECT_TRUE(IsError(Parse(bytes).status(), kInvalid, {kSource, "duplicate key 'dtype'"}));
}

TEST(ParseSafetensorsHeaderTest, JsonNestedDeeperThanAHeaderIsAnError) {
  const auto nested_shape =
      SafetensorsBytes(R"({"w": {"dtype": "F32", "shape": [[1]], "data_offsets": [0, 4]}})", 4);
  EXPECT_TRUE(IsError(Parse(nested_shape).status(), kInvalid, {kSource, "nested deeper"}));
  // Deep enough to overflow a recursive parser's stack.
  const std::string deep =
      absl::StrCat(R"({"w": )", std::string(100000, '['), std::string(100000, ']'), "}");
  EXPECT_TRUE(IsError(Parse(SafetensorsBytes(deep)).status(), kInvalid, {kSource, "nested"}));
}

TEST(ParseSafetensorsHeaderTest, UnknownDtypeIsAnErrorNamingTensorAndDtype) {
  const auto bytes = SafetensorsBytes(
      R"({"layer.w": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}})", 16);
  EXPECT_TRUE(
      IsError(Parse(bytes).status(), kInvalid, {kSource, "tensor 'layer.w'", "dtype 'F128'"}));
}

TEST(ParseSafetensorsHeaderTest, UnknownKeyInATensorEntryIsAnErrorNamingTheKey) {
  const auto bytes = SafetensorsBytes(
      R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "stride": [1]}})", 4);
  EXPECT_TRUE(
      IsError(Parse(bytes).status(), kInvalid, {kSource, "tensor 'w'", "unknown key 'stride'"}));
}

TEST(ParseSafetensorsHeaderTest, MissingDtypeShapeOrOffsetsIsAnErrorNamingTheTensor) {
  const struct {
    const char* header;
    const char* detail;
  } cases[] = {
      {R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", "'dtype' missing"},
      {R"({"w": {"dtype": 7, "shape": [1], "data_offsets": [0, 4]}})", "'dtype' missing"},
      {R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", "'shape' missing"},
      {R"({"w": {"dtype": "F32", "shape": [1]}})", "'data_offsets' must be [begin, end]"},
      {R"({"w": [1, 2]})", "expected an object"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.header);
    EXPECT_TRUE(IsError(Parse(SafetensorsBytes(c.header, 4)).status(), kInvalid,
                        {kSource, "tensor 'w'", c.detail}));
  }
}

TEST(ParseSafetensorsHeaderTest, NegativeShapeDimensionIsAnError) {
  const auto bytes =
      SafetensorsBytes(R"({"w": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 0]}})");
  EXPECT_TRUE(IsError(Parse(bytes).status(), kInvalid,
                      {kSource, "tensor 'w' shape", "non-negative integer, found -1"}));
}

TEST(ParseSafetensorsHeaderTest, NonIntegerShapeDimensionIsAnError) {
  for (const char* dim : {"1.5", R"("2")", "true", "null"}) {
    SCOPED_TRACE(dim);
    const auto bytes = SafetensorsBytes(
        absl::StrCat(R"({"w": {"dtype": "F32", "shape": [)", dim, R"(], "data_offsets": [0, 8]}})"),
        8);
    EXPECT_TRUE(IsError(Parse(bytes).status(), kInvalid,
                        {kSource, "tensor 'w' shape", "non-negative integer, found"}));
  }
}

TEST(ParseSafetensorsHeaderTest, ShapeWhoseElementCountOverflowsIsAnError) {
  const auto bytes = SafetensorsBytes(
      R"({"w": {"dtype": "U8", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})");
  EXPECT_TRUE(IsError(Parse(bytes).status(), kInvalid,
                      {kSource, "tensor 'w'", "[4294967296,4294967296]", "overflows"}));
  // A single dimension beyond int64.
  const auto too_big = SafetensorsBytes(
      R"({"w": {"dtype": "U8", "shape": [9223372036854775808], "data_offsets": [0, 0]}})");
  EXPECT_TRUE(IsError(Parse(too_big).status(), kInvalid, {kSource, "tensor 'w'", "overflows"}));
}

TEST(ParseSafetensorsHeaderTest, ShapeWhoseByteSizeOverflowsIsAnError) {
  // 2^62 elements fit in int64, 2^62 * 4 bytes do not fit in uint64.
  const auto bytes = SafetensorsBytes(
      R"({"w": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 0]}})");
  EXPECT_TRUE(IsError(Parse(bytes).status(), kInvalid,
                      {kSource, "tensor 'w'", "[4611686018427387904]", "overflows"}));
}

TEST(ParseSafetensorsHeaderTest, DataOffsetsThatAreNotAPairAreAnError) {
  for (const char* offsets : {"[0]", "[0, 4, 8]", "[]", R"("0-4")", "{}"}) {
    SCOPED_TRACE(offsets);
    const auto bytes = SafetensorsBytes(
        absl::StrCat(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": )", offsets, "}}"), 8);
    EXPECT_TRUE(IsError(Parse(bytes).status(), kInvalid,
                        {kSource, "tensor 'w'", "'data_offsets' must be [begin, end]"}));
  }
  const auto negative =
      SafetensorsBytes(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 8);
  EXPECT_TRUE(IsError(Parse(negative).status(), kInvalid,
                      {kSource, "tensor 'w' data_offsets", "non-negative integer, found -4"}));
}

TEST(ParseSafetensorsHeaderTest, DataOffsetsEndingBeforeTheyBeginAreAnError) {
  const auto bytes =
      SafetensorsBytes(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8);
  EXPECT_TRUE(IsError(Parse(bytes).status(), kInvalid,
                      {kSource, "tensor 'w'", "[8, 4]", "end before they begin"}));
}

TEST(ParseSafetensorsHeaderTest, DataOffsetsDisagreeingWithShapeAndDtypeAreAnError) {
  const auto bytes =
      SafetensorsBytes(R"({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 8]}})", 16);
  EXPECT_TRUE(IsError(Parse(bytes).status(), kInvalid,
                      {kSource, "tensor 'w'", "span 8 bytes", "[2,3] of BF16 needs 12"}));
}

TEST(ParseSafetensorsHeaderTest, DataOffsetsPastTheDataSectionMeanATruncatedFile) {
  const auto bytes =
      SafetensorsBytes(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 12);
  EXPECT_TRUE(IsError(Parse(bytes).status(), kInvalid,
                      {kSource, "tensor 'w'", "[0, 16]", "data section (12 bytes)", "truncated"}));
}

TEST(ParseSafetensorsHeaderTest, OverlappingTensorRangesAreAnErrorNamingBoth) {
  const auto bytes = SafetensorsBytes(R"({
    "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
    "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
                                      12);
  EXPECT_TRUE(IsError(Parse(bytes).status(), kInvalid,
                      {kSource, "'a' and 'b'", "overlapping data_offsets"}));
}

TEST(ParseSafetensorsHeaderTest, MetadataThatIsNotAnObjectIsAnError) {
  for (const char* metadata : {"[]", R"("pt")", "1"}) {
    SCOPED_TRACE(metadata);
    const auto bytes = SafetensorsBytes(absl::StrCat(R"({"__metadata__": )", metadata, "}"));
    EXPECT_TRUE(
        IsError(Parse(bytes).status(), kInvalid, {kSource, "'__metadata__' must be an object"}));
  }
}

TEST(ParseSafetensorsHeaderTest, MetadataWithANonStringValueIsAnErrorNamingTheKey) {
  const auto bytes = SafetensorsBytes(R"({"__metadata__": {"format": "pt", "step": 12}})");
  EXPECT_TRUE(IsError(Parse(bytes).status(), kInvalid,
                      {kSource, "'__metadata__' value of 'step'", "found 12"}));
}

// ---- Accepted headers ----------------------------------------------------------------------

TEST(ParseSafetensorsHeaderTest, ValidHeaderGivesEntriesSortedByNameAndItsMetadata) {
  const std::string header = R"({
    "z.bias": {"dtype": "F16", "shape": [3], "data_offsets": [0, 6]},
    "__metadata__": {"format": "pt", "note": "x"},
    "a.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [6, 22]},
    "m.ids": {"dtype": "I64", "shape": [], "data_offsets": [22, 30]}})";
  const auto bytes = SafetensorsBytes(header, 30);
  absl::StatusOr<SafetensorsHeader> parsed = Parse(bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->data_offset, 8 + header.size());
  EXPECT_EQ(parsed->data_size, 30u);
  ASSERT_EQ(parsed->tensors.size(), 3u);
  EXPECT_EQ(parsed->tensors[0].name, "a.weight");
  EXPECT_EQ(parsed->tensors[0].dtype, "F32");
  EXPECT_EQ(parsed->tensors[0].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(parsed->tensors[0].begin, 6u);
  EXPECT_EQ(parsed->tensors[0].end, 22u);
  EXPECT_EQ(parsed->tensors[0].numel(), 4);
  EXPECT_EQ(parsed->tensors[1].name, "m.ids");
  EXPECT_TRUE(parsed->tensors[1].shape.empty());  // a scalar: one element
  EXPECT_EQ(parsed->tensors[1].numel(), 1);
  EXPECT_EQ(parsed->tensors[2].name, "z.bias");
  EXPECT_EQ(parsed->tensors[2].dtype, "F16");
  using Pair = std::pair<std::string, std::string>;
  EXPECT_EQ(parsed->metadata, (std::vector<Pair>{{"format", "pt"}, {"note", "x"}}));
}

TEST(ParseSafetensorsHeaderTest, ZeroSizedTensorsAreValidAndMayShareAnOffset) {
  const auto bytes = SafetensorsBytes(R"({
    "empty_a": {"dtype": "F32", "shape": [0, 5], "data_offsets": [4, 4]},
    "empty_b": {"dtype": "BF16", "shape": [3, 0], "data_offsets": [4, 4]},
    "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
                                      4);
  absl::StatusOr<SafetensorsHeader> parsed = Parse(bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->tensors.size(), 3u);
  EXPECT_EQ(parsed->tensors[0].numel(), 0);
  EXPECT_EQ(parsed->tensors[1].numel(), 0);
  EXPECT_TRUE(parsed->metadata.empty());
}

TEST(ParseSafetensorsHeaderTest, EmptyHeaderObjectIsAFileWithNoTensors) {
  absl::StatusOr<SafetensorsHeader> parsed = Parse(SafetensorsBytes("{}"));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->tensors.empty());
  EXPECT_EQ(parsed->data_size, 0u);
}

TEST(ParseSafetensorsHeaderTest, FindReturnsTheEntryByExactNameOrNull) {
  const auto bytes = SafetensorsBytes(R"({
    "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
    "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
    "c": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                                      12);
  absl::StatusOr<SafetensorsHeader> parsed = Parse(bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  for (const char* name : {"a", "b", "c"}) {
    const SafetensorsEntry* e = parsed->Find(name);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_EQ(e->name, name);
  }
  EXPECT_EQ(parsed->Find("b")->begin, 4u);
  EXPECT_EQ(parsed->Find(""), nullptr);
  EXPECT_EQ(parsed->Find("aa"), nullptr);
  EXPECT_EQ(parsed->Find("d"), nullptr);
  EXPECT_EQ(parsed->Find("__metadata__"), nullptr);
}

TEST(SafetensorsDTypeSizeTest, KnowsEverySafetensorsDtypeAndRejectsOthers) {
  EXPECT_EQ(SafetensorsDTypeSize("BOOL"), 1u);
  EXPECT_EQ(SafetensorsDTypeSize("F8_E4M3"), 1u);
  EXPECT_EQ(SafetensorsDTypeSize("BF16"), 2u);
  EXPECT_EQ(SafetensorsDTypeSize("F16"), 2u);
  EXPECT_EQ(SafetensorsDTypeSize("F32"), 4u);
  EXPECT_EQ(SafetensorsDTypeSize("I64"), 8u);
  EXPECT_EQ(SafetensorsDTypeSize("f32"), 0u);
  EXPECT_EQ(SafetensorsDTypeSize(""), 0u);
}

// ---- Writing -------------------------------------------------------------------------------

// Values that exercise rounding: ties, subnormals and overflow in half precision.
const std::vector<float> kValues = {1.0f,     -2.5f,  0.1f,  3.14159265f, 1.0f + 0x1.0p-8f,
                                    65504.0f, 1e5f,   1e-7f, -0.0f,       1.0f + 0x1.8p-7f,
                                    1e-30f,   -1e30f, 7.0f,  0.333333f,   -123.456f};

// Writes a (3, 5) tensor "w" of kValues and a (2) tensor "a" as `dtype`, and opens the file.
SafetensorsFile WriteAndOpen(const std::string& path, DType dtype) {
  const std::vector<float> a = {-1.0f, 0.5f};
  const std::vector<SafetensorsTensorToWrite> tensors = {{"w", {3, 5}, kValues.data()},
                                                         {"a", {2}, a.data()}};
  const absl::Status written = WriteSafetensors(path, tensors, dtype, {{"format", "pt"}});
  EXPECT_TRUE(written.ok()) << written;
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(std::filesystem::file_size(path),
            file->header().data_offset + SafetensorsDataBytes(tensors, dtype));
  return *std::move(file);
}

TEST(WriteSafetensorsTest, F32FileReadsBackBitExact) {
  ScopedTempDir dir;
  const SafetensorsFile file = WriteAndOpen(dir.File("w.safetensors"), DType::kF32);
  const SafetensorsHeader& h = file.header();
  using Pair = std::pair<std::string, std::string>;
  EXPECT_EQ(h.metadata, (std::vector<Pair>{{"format", "pt"}}));
  const SafetensorsEntry* w = h.Find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, "F32");
  EXPECT_EQ(w->shape, (std::vector<int64_t>{3, 5}));
  const absl::Span<const uint8_t> bytes = file.Data(*w);
  ASSERT_EQ(bytes.size(), kValues.size() * 4);
  std::vector<float> back(kValues.size());
  std::memcpy(back.data(), bytes.data(), bytes.size());
  for (size_t i = 0; i < kValues.size(); ++i) {
    EXPECT_EQ(BitsFromF32(back[i]), BitsFromF32(kValues[i])) << i;
  }
}

// The bytes of `entry` read as little-endian 16-bit words.
std::vector<uint16_t> Words(const SafetensorsFile& file, const SafetensorsEntry& entry) {
  const absl::Span<const uint8_t> bytes = file.Data(entry);
  std::vector<uint16_t> words(bytes.size() / 2);
  for (size_t i = 0; i < words.size(); ++i) {
    words[i] = static_cast<uint16_t>(bytes[2 * i] | (bytes[2 * i + 1] << 8));
  }
  return words;
}

TEST(WriteSafetensorsTest, Bf16FileHoldsRoundedToNearestEvenValues) {
  ScopedTempDir dir;
  const SafetensorsFile file = WriteAndOpen(dir.File("w.safetensors"), DType::kBF16);
  const SafetensorsEntry* w = file.header().Find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, "BF16");
  const std::vector<uint16_t> words = Words(file, *w);
  ASSERT_EQ(words.size(), kValues.size());
  for (size_t i = 0; i < kValues.size(); ++i) EXPECT_EQ(words[i], F32ToBf16(kValues[i])) << i;
  EXPECT_EQ(words[0], 0x3f80);  // 1.0
  // bf16 keeps 7 mantissa bits: 1 + 2^-8 and 1 + 3 * 2^-8 are ties, rounded to the even
  // mantissa (0 and 2).
  EXPECT_EQ(words[4], 0x3f80);
  EXPECT_EQ(words[9], 0x3f82);
}

TEST(WriteSafetensorsTest, F16FileHoldsRoundedToNearestEvenValues) {
  ScopedTempDir dir;
  const SafetensorsFile file = WriteAndOpen(dir.File("w.safetensors"), DType::kF16);
  const SafetensorsEntry* w = file.header().Find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, "F16");
  const std::vector<uint16_t> words = Words(file, *w);
  ASSERT_EQ(words.size(), kValues.size());
  for (size_t i = 0; i < kValues.size(); ++i) EXPECT_EQ(words[i], F32ToF16(kValues[i])) << i;
  EXPECT_EQ(words[0], 0x3c00);  // 1.0
  EXPECT_EQ(words[5], 0x7bff);  // 65504, the largest half
  EXPECT_EQ(words[6], 0x7c00);  // 1e5 overflows to infinity
  EXPECT_EQ(words[8], 0x8000);  // -0.0 keeps its sign
}

TEST(WriteSafetensorsTest, TensorsAreStoredInNameOrderWithContiguousOffsets) {
  ScopedTempDir dir;
  const SafetensorsFile file = WriteAndOpen(dir.File("w.safetensors"), DType::kBF16);
  const SafetensorsEntry* a = file.header().Find("a");
  const SafetensorsEntry* w = file.header().Find("w");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(a->begin, 0u);
  EXPECT_EQ(a->end, 4u);
  EXPECT_EQ(w->begin, 4u);
  EXPECT_EQ(w->end, 4u + 2 * kValues.size());
  EXPECT_EQ(file.header().data_size, w->end);
}

TEST(WriteSafetensorsTest, HeaderIsPaddedWithSpacesToAMultipleOfEightBytes) {
  ScopedTempDir dir;
  const float one = 1.0f;
  // Names of 1..8 characters shift the header length through every residue mod 8.
  for (int len = 1; len <= 8; ++len) {
    const std::string path = dir.File(absl::StrCat("pad", len, ".safetensors"));
    const std::vector<SafetensorsTensorToWrite> tensors = {{std::string(len, 'x'), {1}, &one}};
    ASSERT_TRUE(WriteSafetensors(path, tensors, DType::kF32, {}).ok());
    absl::StatusOr<std::string> bytes = ReadFileToString(path);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>((*bytes)[i]);
    EXPECT_EQ(header_len % 8, 0u) << len;
    const std::string header = bytes->substr(8, header_len);
    const size_t last_brace = header.find_last_of('}');
    ASSERT_NE(last_brace, std::string::npos);
    EXPECT_LT(header.size() - last_brace - 1, 8u);
    EXPECT_EQ(header.find_first_not_of(' ', last_brace + 1), std::string::npos) << header;
    EXPECT_EQ(header.find("__metadata__"), std::string::npos);  // none given, none written
    EXPECT_EQ(bytes->size(), 8 + header_len + 4);
  }
}

TEST(WriteSafetensorsTest, WritingReplacesAnExistingFileAndLeavesNoTemporaryFile) {
  ScopedTempDir dir;
  const std::string path = dir.File("model.safetensors");
  ::prl::testing::WriteBytes(path, std::vector<uint8_t>(1000, 0xff));
  const float v[2] = {4.0f, 5.0f};
  const std::vector<SafetensorsTensorToWrite> tensors = {{"v", {2}, v}};
  ASSERT_TRUE(WriteSafetensors(path, tensors, DType::kF32, {}).ok());
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_NE(file->header().Find("v"), nullptr);
  EXPECT_EQ(file->Data(*file->header().Find("v"))[0], 0x00);  // 4.0f = 0x40800000, LE
  EXPECT_EQ(file->Data(*file->header().Find("v"))[3], 0x40);
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    names.push_back(e.path().filename().string());
  }
  EXPECT_EQ(names, std::vector<std::string>{"model.safetensors"});
}

TEST(WriteSafetensorsTest, NonFloatOutputDtypeIsRejectedAndWritesNothing) {
  ScopedTempDir dir;
  const std::string path = dir.File("ids.safetensors");
  const float v = 1.0f;
  const std::vector<SafetensorsTensorToWrite> tensors = {{"v", {1}, &v}};
  EXPECT_TRUE(
      IsError(WriteSafetensors(path, tensors, DType::kI32, {}), kInvalid, {"F32, BF16 or F16"}));
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(WriteSafetensorsTest, DuplicateReservedOrNonUtf8NamesAreRejectedAndWriteNothing) {
  ScopedTempDir dir;
  const std::string path = dir.File("bad_names.safetensors");
  const float v = 1.0f;
  const std::vector<SafetensorsTensorToWrite> duplicate = {{"w", {1}, &v}, {"w", {1}, &v}};
  EXPECT_TRUE(IsError(WriteSafetensors(path, duplicate, DType::kF32, {}), kInvalid,
                      {"two tensors are named 'w'"}));
  const std::vector<SafetensorsTensorToWrite> reserved = {{"__metadata__", {1}, &v}};
  EXPECT_TRUE(IsError(WriteSafetensors(path, reserved, DType::kF32, {}), kInvalid,
                      {"'__metadata__' cannot name a tensor"}));
  const std::vector<SafetensorsTensorToWrite> not_utf8 = {{"w\xff", {1}, &v}};
  EXPECT_TRUE(
      IsError(WriteSafetensors(path, not_utf8, DType::kF32, {}), kInvalid, {"valid UTF-8"}));
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(WriteSafetensorsTest, ZeroSizedTensorsRoundTrip) {
  ScopedTempDir dir;
  const std::string path = dir.File("empty.safetensors");
  const float one = 1.0f;
  const std::vector<SafetensorsTensorToWrite> tensors = {{"empty", {0, 4}, nullptr},
                                                         {"one", {1}, &one}};
  ASSERT_TRUE(WriteSafetensors(path, tensors, DType::kF16, {}).ok());
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_NE(file->header().Find("empty"), nullptr);
  EXPECT_EQ(file->header().Find("empty")->shape, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(file->Data(*file->header().Find("empty")).size(), 0u);
  EXPECT_EQ(Words(*file, *file->header().Find("one")), std::vector<uint16_t>{0x3c00});
}

}  // namespace
}  // namespace prl
