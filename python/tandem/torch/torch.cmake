# tandem.torch's C++ extension: PyTorch's "tandem" c10d backend (python/tandem/torch/csrc/), a
# thin shim over libtandem's comm layer (docs/torch.md). Optional: it builds only where a Python
# with PyTorch 2.x is found, and the rest of the tree never depends on it.
#
#   TANDEM_TORCH         AUTO (build where torch is found), ON (fail without it), OFF
#   TANDEM_TORCH_PYTHON  the Python whose torch to build against; default: the frameworks venv
#                        (TANDEM_FRAMEWORKS_VENV, else scripts/venv.sh --print-frameworks)
#
# Output: <build>/python/tandem/torch/_tandem_c10d<EXT_SUFFIX>; tandem.torch loads it from
# TANDEM_TORCH_EXT or from its own directory (where a wheel puts it). Self-contained so the
# wheel's build can include this file as it is.
set(TANDEM_TORCH AUTO CACHE STRING "Build the PyTorch backend extension: AUTO, ON, OFF")
set_property(CACHE TANDEM_TORCH PROPERTY STRINGS AUTO ON OFF)
set(tandem_torch_default_python "")
if(DEFINED ENV{TANDEM_FRAMEWORKS_VENV})
  set(tandem_torch_default_python $ENV{TANDEM_FRAMEWORKS_VENV}/bin/python)
else()
  execute_process(COMMAND bash ${CMAKE_SOURCE_DIR}/scripts/venv.sh --print-frameworks
                  OUTPUT_VARIABLE fw_venv OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(fw_venv)
    set(tandem_torch_default_python ${fw_venv}/bin/python)
  endif()
endif()
set(TANDEM_TORCH_PYTHON "${tandem_torch_default_python}" CACHE FILEPATH
    "Python with PyTorch 2.x to build tandem.torch's extension against")

set(TANDEM_HAVE_TORCH OFF)
set(tandem_torch_why "TANDEM_TORCH=OFF")
if(NOT TANDEM_TORCH STREQUAL "OFF")
  set(tandem_torch_why "no Python at '${TANDEM_TORCH_PYTHON}' (make the frameworks venv: scripts/venv.sh)")
  if(TANDEM_TORCH_PYTHON AND EXISTS ${TANDEM_TORCH_PYTHON})
    # One line per fact: include dirs (;-list), lib dir, python include, extension suffix, ABI.
    execute_process(
      COMMAND ${TANDEM_TORCH_PYTHON} -c
"import os, sysconfig, torch
from torch.utils import cpp_extension as c
assert int(torch.__version__.split('.')[0]) >= 2, 'torch ' + torch.__version__ + ' is older than 2.0'
print(';'.join(c.include_paths()))
print(os.path.join(os.path.dirname(torch.__file__), 'lib'))
print(sysconfig.get_paths()['include'])
print(sysconfig.get_config_var('EXT_SUFFIX'))
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(torch.__version__)"
      OUTPUT_VARIABLE torch_facts ERROR_VARIABLE torch_err RESULT_VARIABLE torch_rc
      OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(torch_rc EQUAL 0)
      string(REPLACE "\n" ";" torch_facts "${torch_facts}")
      list(LENGTH torch_facts n)
      # the include list is itself ;-separated: the last five entries are the single facts
      math(EXPR i_ver "${n} - 1")
      math(EXPR i_abi "${n} - 2")
      math(EXPR i_suffix "${n} - 3")
      math(EXPR i_pyinc "${n} - 4")
      math(EXPR i_lib "${n} - 5")
      list(GET torch_facts ${i_ver} TANDEM_TORCH_VERSION)
      list(GET torch_facts ${i_abi} torch_abi)
      list(GET torch_facts ${i_suffix} torch_suffix)
      list(GET torch_facts ${i_pyinc} torch_pyinc)
      list(GET torch_facts ${i_lib} torch_libdir)
      list(SUBLIST torch_facts 0 ${i_lib} torch_includes)
      if(EXISTS ${torch_pyinc}/Python.h)
        set(TANDEM_HAVE_TORCH ON)
      else()
        set(tandem_torch_why "no Python.h in ${torch_pyinc} (apt-get install python3-dev)")
      endif()
    else()
      string(STRIP "${torch_err}" torch_err)
      string(REGEX REPLACE ".*\n" "" torch_err "${torch_err}")
      set(tandem_torch_why "${TANDEM_TORCH_PYTHON} cannot import torch: ${torch_err}")
    endif()
  endif()
endif()

if(NOT TANDEM_HAVE_TORCH)
  if(TANDEM_TORCH STREQUAL "ON")
    message(FATAL_ERROR "TANDEM_TORCH=ON but the extension cannot be built: ${tandem_torch_why}; "
                        "set -DTANDEM_TORCH_PYTHON=/path/to/python with torch, or -DTANDEM_TORCH=AUTO")
  endif()
  message(STATUS "tandem: PyTorch backend extension off: ${tandem_torch_why}")
  return()
endif()

enable_language(CXX)
add_library(tandem_torch_ext MODULE ${CMAKE_CURRENT_LIST_DIR}/csrc/tandem_c10d.cpp)
target_include_directories(tandem_torch_ext SYSTEM PRIVATE ${torch_includes} ${torch_pyinc})
target_compile_features(tandem_torch_ext PRIVATE cxx_std_20)
target_compile_definitions(tandem_torch_ext PRIVATE _GLIBCXX_USE_CXX11_ABI=${torch_abi}
                           TORCH_EXTENSION_NAME=_tandem_c10d)
target_compile_options(tandem_torch_ext PRIVATE -Wall -Wextra -fvisibility=hidden
                       $<$<BOOL:${TANDEM_WERROR}>:-Werror>)
# The comm layer and its core, linked into a shared module: position-independent code.
set_target_properties(td_comm td_core PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_link_libraries(tandem_torch_ext PRIVATE td_comm td_core
  ${torch_libdir}/libtorch_python.so ${torch_libdir}/libtorch.so
  ${torch_libdir}/libtorch_cpu.so ${torch_libdir}/libc10.so)
set_target_properties(tandem_torch_ext PROPERTIES
  OUTPUT_NAME _tandem_c10d PREFIX "" SUFFIX "${torch_suffix}"
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/python/tandem/torch
  BUILD_RPATH ${torch_libdir})
message(STATUS "tandem: PyTorch backend extension on (torch ${TANDEM_TORCH_VERSION}, "
               "C++11 ABI ${torch_abi}, ${TANDEM_TORCH_PYTHON})")
# In a wheel (scikit-build-core sets SKBUILD) the module goes beside tandem/torch/__init__.py,
# where `import tandem.torch` looks first after TANDEM_TORCH_EXT. Its torch libraries are found
# as the ones `import torch` has already loaded (by soname), so no runtime path is needed.
if(SKBUILD)
  install(TARGETS tandem_torch_ext LIBRARY DESTINATION tandem/torch COMPONENT wheel)
endif()
