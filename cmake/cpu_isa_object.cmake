# cmake -P script: one instruction set's kernel objects -> one object whose only global symbols
# are in namespace huddle::kernels::isa_<ISA> (see HuddleCpuIsa.cmake for why).
# Inputs: ISA, OUTPUT, OBJECTS ('|'-separated), CXX, NM, OBJCOPY, OBJDUMP.
string(REPLACE "|" ";" objects "${OBJECTS}")
set(partial ${OUTPUT}.partial.o)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cpu isa ${ISA}: `${ARGN}` failed (${rc}):\n${out}${err}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

# 1. One relocatable object for the set (template instantiations shared within it are merged).
run(${CXX} -r -nostdlib -o ${partial} ${objects})
# 2. Every definition outside huddle::kernels::isa_<ISA> local; no COMDAT groups left.
string(LENGTH "isa_${ISA}" length)
run(${OBJCOPY} --wildcard "--keep-global-symbol=_ZN6huddle7kernels${length}isa_${ISA}*"
  --remove-section=.group ${partial} ${OUTPUT})
file(REMOVE ${partial})

# 3. Checks of the result.
run(${NM} --defined-only --extern-only ${OUTPUT})
string(REGEX MATCHALL "[^\n]+" exported "${run_output}")
foreach(line ${exported})
  if(NOT line MATCHES " _ZN6huddle7kernels${length}isa_${ISA}")
    message(FATAL_ERROR "cpu isa ${ISA}: ${OUTPUT} exports `${line}`, outside isa_${ISA}")
  endif()
endforeach()
run(${OBJDUMP} -d --no-show-raw-insn ${OUTPUT})
if(ISA STREQUAL "baseline")
  # VEX/EVEX code (AVX and later) uses ymm/zmm registers or v-prefixed mnemonics (GNU objdump
  # puts a space after the mnemonic, llvm-objdump a tab).
  string(REGEX MATCH "\t(v[a-z0-9]+[ \t][^\n]*|[^\n]*%[yz]mm[0-9]+[^\n]*)" vex "${run_output}")
  if(vex)
    message(FATAL_ERROR "cpu isa baseline: ${OUTPUT} holds an AVX instruction: ${vex}")
  endif()
elseif(ISA STREQUAL "avx2")
  if(NOT run_output MATCHES "\tvfmadd[0-9a-z]+[ \t][^\n]*%ymm")
    message(FATAL_ERROR "cpu isa avx2: ${OUTPUT} has no 256-bit fused multiply-add")
  endif()
elseif(ISA STREQUAL "avx512")
  if(NOT run_output MATCHES "\tvfmadd[0-9a-z]+[ \t][^\n]*%zmm")
    message(FATAL_ERROR "cpu isa avx512: ${OUTPUT} has no 512-bit fused multiply-add")
  endif()
endif()
