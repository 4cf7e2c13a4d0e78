# The paged-KV engine soak (tests/unit/test_engine_paged_soak.cpp) under ASan + UBSan:
# runs build-fuzz/tests/test_engine_paged_soak (clang, ASan + UBSan; built by
# scripts/build_fuzz.sh, which scripts/run_tests.sh calls), else the GCC ASan build of
# scripts/run_asan_soak.sh. Skipped (exit 77) when neither exists, e.g. a plain developer
# build. Leaks end the run with an error (LeakSanitizer is on by default with ASan).
add_test(NAME asan.engine_paged_soak
  COMMAND bash -c "for b in '${CMAKE_SOURCE_DIR}/build-fuzz/tests/test_engine_paged_soak' '${CMAKE_SOURCE_DIR}/build-asan-soak/tests/test_engine_paged_soak'; do [ -x \"$b\" ] && UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 exec \"$b\"; done; exit 77")
set_tests_properties(asan.engine_paged_soak PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
