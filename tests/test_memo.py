"""The one remembering table every cache of the project uses."""

from shardwise.memo import Memo


class Owner:
    pass


def test_a_value_is_made_once_per_owner_and_key_and_again_for_another_owner():
    memo, made = Memo(8), []

    def make(tag: str):
        return lambda: made.append(tag) or tag

    a, b = Owner(), Owner()
    assert memo.get((a,), "k", make("a")) == "a"
    assert memo.get((a,), "k", make("again")) == "a"  # remembered
    assert memo.get((b,), "k", make("b")) == "b"  # another owner, another value
    assert memo.get((a,), "other", make("a2")) == "a2"
    assert memo.get((a, b), "k", make("ab")) == "ab"  # several owners: each must be the same object
    assert memo.get((a, b), "k", make("ab again")) == "ab"
    assert memo.get((b, a), "k", make("ba")) == "ba"
    assert made == ["a", "b", "a2", "ab", "ba"]


def test_the_least_recently_used_goes_first_and_the_owners_are_held():
    memo = Memo(2)
    a, b, c = Owner(), Owner(), Owner()
    memo.get((a,), 0, lambda: "a")
    memo.get((b,), 0, lambda: "b")
    memo.get((a,), 0, lambda: "unused")  # a is used again: b is now the oldest
    memo.get((c,), 0, lambda: "c")
    assert len(memo) == 2
    assert memo.get((a,), 0, lambda: "a made again") == "a"
    assert memo.get((b,), 0, lambda: "b made again") == "b made again"
    held = Owner()
    memo.get((held,), 1, lambda: "kept")
    ident = id(held)
    del held  # its entry holds it: the id cannot name a new object while the entry lives
    assert all(id(o) != ident for o in [Owner() for _ in range(100)])
