#ifndef HERD_CORE_DETAIL_FUNCTION_REF_HPP
#define HERD_CORE_DETAIL_FUNCTION_REF_HPP
// A reference to a callable, without its type: a function that takes one is compiled once, not
// once per lambda passed to it. herd's engine passes its callbacks (an operation's body, where a
// rank's operand of a reduction lies) this way, so that a file that calls several collectives
// compiles the operation's error handling and the reduction loops of every dtype once each.
// It refers to the callable and does not own it: the callable must outlive the call that takes
// the reference, which is how every use here passes a lambda (as an argument of the call).

#include <memory>
#include <type_traits>
#include <utility>

namespace herd::detail {

template <class Signature> class function_ref;

template <class R, class... Args> class function_ref<R(Args...)> {
 public:
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, function_ref> && std::is_invocable_r_v<R, F&, Args...>)
  function_ref(F&& f) noexcept  // NOLINT(google-explicit-constructor): a lambda is passed as it is
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* object, Args... args) -> R {
          auto& callable = *static_cast<std::remove_reference_t<F>*>(object);
          if constexpr (std::is_void_v<R>) {
            callable(std::forward<Args>(args)...);
          } else {
            return callable(std::forward<Args>(args)...);
          }
        }) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

}  // namespace herd::detail

#endif  // HERD_CORE_DETAIL_FUNCTION_REF_HPP
