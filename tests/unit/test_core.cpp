// Tests of src/core: dtype conversions against known bit patterns, the blocking thread
// pool's coverage and determinism of chunking, mapped files and their errors.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <vector>

#include "core/dtype.h"
#include "core/env.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "core/thread_pool.h"

using namespace dsinfer;

TEST(Core, Bf16RoundTripAndRounding) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xc000), -2.0f);
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: rounds to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(Core, F16Conversions) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // NaNs
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h) << h;
  }
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);
}

TEST(Core, DtypeNames) {
  EXPECT_EQ(dtype_from_safetensors("BF16", "t"), DType::BF16);
  EXPECT_EQ(dtype_size(DType::F16), 2u);
  EXPECT_EQ(dtype_from_safetensors("F8_E4M3", "t"), DType::F8E4M3);  // FP8 codes (V4 weights)
  EXPECT_EQ(dtype_size(DType::F8E8M0), 1u);
  EXPECT_STREQ(dtype_name(DType::F8E4M3), "F8_E4M3");
  try {
    dtype_from_safetensors("F8_E5M2", "model.safetensors: tensor 'w'");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'w'"), std::string::npos);
  }
}

TEST(Core, ThreadPoolCoversRangeOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (size_t n : {1u, 2u, 7u, 100u, 1001u}) {
      std::vector<std::atomic<int>> hits(n);
      for (int rep = 0; rep < 3; ++rep)
        pool.parallel_for(n, [&](size_t b, size_t e) {
          for (size_t i = b; i < e; ++i) hits[i]++;
        });
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 3) << "threads " << threads << " n " << n;
    }
  }
}

TEST(Core, ThreadPoolGrainLimitsChunks) {
  ThreadPool pool(4);
  std::atomic<int> calls{0};
  pool.parallel_for(10, [&](size_t b, size_t e) { calls++; }, 8);
  EXPECT_LE(calls.load(), 2);
}

TEST(Core, MappedFileReadsAndErrors) {
  std::string path = ::testing::TempDir() + "/dsinfer_mapped.bin";
  {
    std::ofstream f(path, std::ios::binary);
    f << "hello";
  }
  MappedFile m(path);
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m.data()), 5), "hello");
  try {
    MappedFile bad(path + ".missing");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(".missing"), std::string::npos);
  }
  std::remove(path.c_str());
}

// The environment's switches and choices: unset or empty keeps the default, an allowed value
// sets it, anything else is an Error naming the variable and what it accepts.
TEST(Core, EnvironmentSwitchesAndChoices) {
  const char* name = "DSINFER_TEST_ENV_CHOICE";
  unsetenv(name);
  EXPECT_EQ(env_choice(name, {4, 8, 16}, 8), 8);
  EXPECT_TRUE(env_switch(name, true));
  setenv(name, "", 1);
  EXPECT_EQ(env_choice(name, {4, 8, 16}, 4), 4);
  setenv(name, "16", 1);
  EXPECT_EQ(env_choice(name, {4, 8, 16}, 4), 16);
  setenv(name, "1", 1);
  EXPECT_TRUE(env_switch(name, false));
  setenv(name, "12", 1);
  try {
    env_choice(name, {4, 8, 16}, 4);
    ADD_FAILURE() << "12 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DSINFER_TEST_ENV_CHOICE must be one of 4, 8, 16, not '12'"), std::string::npos) << e.what();
  }
  setenv(name, "yes", 1);
  EXPECT_THROW(env_switch(name, false), Error);
  unsetenv(name);
}
