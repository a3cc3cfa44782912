#ifndef HERD_OPTIM_DETAIL_SCOPED_SWITCH_HPP
#define HERD_OPTIM_DETAIL_SCOPED_SWITCH_HPP
// The guards that no_sync() and skip_synchronize() return (the distributed optimizer's and the
// libtorch DDP wrapper's): a setting turned on for as long as the guard lives.

#include <optional>
#include <utility>

namespace herd::detail {

// Calls flip(true) when made and flip(false) when destroyed. Movable, so that a function can
// return it; the guard moved from lets go of the setting, which the one moved to then owns.
template <class Flip> class scoped_switch {
 public:
  explicit scoped_switch(Flip flip) : flip_(std::move(flip)) { (*flip_)(true); }
  scoped_switch(scoped_switch&& other) noexcept : flip_(std::move(other.flip_)) { other.flip_.reset(); }
  scoped_switch(const scoped_switch&) = delete;
  scoped_switch& operator=(const scoped_switch&) = delete;
  scoped_switch& operator=(scoped_switch&&) = delete;
  ~scoped_switch() {
    if (flip_) (*flip_)(false);
  }

 private:
  std::optional<Flip> flip_;
};

}  // namespace herd::detail

#endif  // HERD_OPTIM_DETAIL_SCOPED_SWITCH_HPP
