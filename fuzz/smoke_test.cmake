# CTest driver of fuzz.codec_smoke: writes the seed corpus into WORK_DIR/seeds, then fuzzes for
# SECONDS into WORK_DIR/corpus (kept between runs). Fails if the fuzzer fails (a crash, leak or
# timeout; its input lands in WORK_DIR/artifacts) or writes any artifact.
# Variables: FUZZER, MAKE_SEEDS, WORK_DIR, DICT, SECONDS.
foreach(var FUZZER MAKE_SEEDS WORK_DIR DICT SECONDS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "smoke_test.cmake: -D${var}=... is required")
  endif()
endforeach()

file(MAKE_DIRECTORY ${WORK_DIR}/corpus ${WORK_DIR}/artifacts)
execute_process(COMMAND ${MAKE_SEEDS} ${WORK_DIR}/seeds RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "make_seed_corpus failed (${rc})")
endif()

execute_process(
  COMMAND ${FUZZER} -max_total_time=${SECONDS} -print_final_stats=1 -dict=${DICT}
    -artifact_prefix=${WORK_DIR}/artifacts/ ${WORK_DIR}/corpus ${WORK_DIR}/seeds
  RESULT_VARIABLE rc)
file(GLOB artifacts ${WORK_DIR}/artifacts/*)
if(NOT rc EQUAL 0 OR artifacts)
  message(FATAL_ERROR "codec_fuzzer failed (exit ${rc}); artifacts: ${artifacts}\n"
    "Reproduce with: ${FUZZER} <artifact>")
endif()
