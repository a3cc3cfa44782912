# herd_program_from_doc(PAGE HEADING OUTPUT): writes to OUTPUT the first ```cpp block after the
# line "HEADING" of the Markdown file PAGE, so that the program a reader copies from the
# documentation is the one the tests build and run. Fails at configure time if the section or
# its block is missing.
function(herd_program_from_doc page heading output)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${page})
  file(READ ${page} text)
  string(FIND "${text}" "\n${heading}\n" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "herd: ${page} has no section \"${heading}\" to build")
  endif()
  string(SUBSTRING "${text}" ${at} -1 text)
  string(FIND "${text}" "```cpp\n" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "herd: the section \"${heading}\" of ${page} has no ```cpp block to build")
  endif()
  math(EXPR at "${at} + 7")
  string(SUBSTRING "${text}" ${at} -1 text)
  string(FIND "${text}" "```" at)
  string(SUBSTRING "${text}" 0 ${at} text)
  file(CONFIGURE OUTPUT ${output} CONTENT "${text}" @ONLY)
endfunction()
