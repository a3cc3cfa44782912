# The reproducible checks of the examples' check.cmake list their runs as "name|environment|flags"
# (environment: NAME=value ...; flags: the program's). herd_run_entry(<entry>) splits one into
# run_name, run_env (a list for `cmake -E env`) and run_flags in the caller's scope.
function(herd_run_entry entry)
  string(REPLACE "|" ";" fields "${entry}")
  list(GET fields 0 name)
  list(GET fields 1 environment)
  list(GET fields 2 flags)
  separate_arguments(environment UNIX_COMMAND "${environment}")
  separate_arguments(flags UNIX_COMMAND "${flags}")
  set(run_name "${name}" PARENT_SCOPE)
  set(run_env "${environment}" PARENT_SCOPE)
  set(run_flags "${flags}" PARENT_SCOPE)
endfunction()
