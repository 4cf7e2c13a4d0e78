# The paged-KV engine soak (tests/unit/test_engine_paged_soak.cpp) under ASan + UBSan:
# runs build-asan-soak/tests/test_engine_paged_soak, built by scripts/run_asan_soak.sh
# (scripts/run_tests.sh does it with DSINFER_ASAN_SOAK=1). Skipped (exit 77) when that
# build is absent, e.g. a plain developer build.
add_test(NAME asan.engine_paged_soak
  COMMAND bash -c "b='${CMAKE_SOURCE_DIR}/build-asan-soak/tests/test_engine_paged_soak'; [ -x \"$b\" ] || exit 77; UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 exec \"$b\"")
set_tests_properties(asan.engine_paged_soak PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
