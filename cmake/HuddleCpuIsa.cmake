# Per-instruction-set builds of CPU kernel sources (kernels/cpu_isa.h says how one is chosen).
#
# huddle_add_cpu_isa_variants(target SOURCES <files> LIBS <targets>) compiles each source once per
# instruction set in HUDDLE_CPU_ISAS, with that set's flags and HUDDLE_CPU_ISA_VARIANT=isa_<name>
# (kernels/cpu_isa_variant.h), and adds one object per set to `target`. The same source is also
# listed among target's own sources, where it is compiled once more with the project's flags and
# holds only the entry points that call the variant of the active set.
#
# The one-definition trap: every variant instantiates the same templates (Eigen's GEMM, the inline
# functions of the headers) as weak COMDAT symbols of the same names, which the final link would
# merge arbitrarily, so AVX2 code could run on a baseline CPU. cpu_isa_object.cmake therefore
# partially links each set's objects into one (`-r`: duplicates within the set merged), keeps
# global only the symbols of namespace huddle::kernels::isa_<name> (every other definition becomes
# local to that object), and removes the COMDAT groups (the final link deduplicates groups by
# signature name even when the signature symbol is local). It then refuses a baseline object that
# holds any VEX-encoded instruction, an AVX2 object without fused multiply-adds and an AVX-512
# object without 512-bit ones (the flags did not take effect).
set(HUDDLE_CPU_ISA_OBJECT_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/cpu_isa_object.cmake)

# The sets, baseline first. Names match kernels/cpu_isa.h's CpuIsa. x86-64 only: elsewhere the
# baseline alone is built and chosen.
set(HUDDLE_CPU_ISAS baseline)
set(HUDDLE_CPU_ISA_FLAGS_baseline "")
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  set(HUDDLE_CPU_ISA_FLAGS_baseline -march=x86-64 -mtune=generic)
  # AVX2 + FMA (the GEMM kernels of x86-64-v3); chosen where __builtin_cpu_supports reports both.
  list(APPEND HUDDLE_CPU_ISAS avx2)
  set(HUDDLE_CPU_ISA_FLAGS_avx2 -march=x86-64 -mavx2 -mfma -mtune=haswell)
  # AVX-512 F/CD/BW/DQ/VL (x86-64-v4), 512-bit vectors in Eigen's GEMM and in the loops GCC
  # vectorises. GCC 12 warns of uninitialized values inside its own avx512fintrin.h when Eigen's
  # packet code is inlined (its intrinsics leave a pass-through operand undefined on purpose).
  list(APPEND HUDDLE_CPU_ISAS avx512)
  set(HUDDLE_CPU_ISA_FLAGS_avx512 -march=x86-64-v4 -mtune=skylake-avx512
    -mprefer-vector-width=512 $<$<CXX_COMPILER_ID:GNU>:-Wno-maybe-uninitialized -Wno-uninitialized>)
endif()

function(huddle_add_cpu_isa_variants target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "SOURCES;LIBS")
  foreach(isa ${HUDDLE_CPU_ISAS})
    set(objects ${target}_isa_${isa})
    add_library(${objects} OBJECT ${arg_SOURCES})
    target_include_directories(${objects} PRIVATE ${PROJECT_SOURCE_DIR})
    target_link_libraries(${objects} PRIVATE ${arg_LIBS})
    # -ffp-contract=off as in huddle_kernels (kernels/hd.h); Eigen's own FMA intrinsics remain.
    # -fno-gnu-unique: statics of inline functions become weak symbols, which objcopy can make
    # local (it leaves STB_GNU_UNIQUE ones global, shared between the sets).
    target_compile_options(${objects} PRIVATE ${HUDDLE_WARNINGS} -ffp-contract=off
      $<$<CXX_COMPILER_ID:GNU>:-fno-gnu-unique> ${HUDDLE_CPU_ISA_FLAGS_${isa}})
    target_compile_definitions(${objects} PRIVATE HUDDLE_CPU_ISA_VARIANT=isa_${isa}
      EIGEN_DONT_PARALLELIZE)
    set(output ${CMAKE_CURRENT_BINARY_DIR}/${target}_isa_${isa}.o)
    add_custom_command(OUTPUT ${output}
      COMMAND ${CMAKE_COMMAND} -DISA=${isa} -DOUTPUT=${output}
        "-DOBJECTS=$<JOIN:$<TARGET_OBJECTS:${objects}>,|>"
        -DCXX=${CMAKE_CXX_COMPILER} -DNM=${CMAKE_NM} -DOBJCOPY=${CMAKE_OBJCOPY}
        -DOBJDUMP=${CMAKE_OBJDUMP} -P ${HUDDLE_CPU_ISA_OBJECT_SCRIPT}
      DEPENDS ${objects} $<TARGET_OBJECTS:${objects}> ${HUDDLE_CPU_ISA_OBJECT_SCRIPT}
      COMMENT "Linking the ${isa} variant of ${target}'s per-ISA kernels"
      VERBATIM)
    set_source_files_properties(${output} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
    target_sources(${target} PRIVATE ${output})
  endforeach()
  set(built "")
  foreach(isa ${HUDDLE_CPU_ISAS})
    list(APPEND built HUDDLE_CPU_ISA_BUILT_${isa}=1)
  endforeach()
  # The entry points (the dispatch pass of the same sources) and kernels/cpu_isa.cc know which
  # variants were built.
  target_compile_definitions(${target} PRIVATE ${built})
endfunction()
