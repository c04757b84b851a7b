from farm.db.base import Where


def test_no_condition_is_no_where_clause():
    assert Where().sql() == ""
    assert Where().equal(serial=None).sql() == ""


def test_conditions_and_their_values_stay_in_step():
    where = Where().add("id > ?", 7).equal(serial=None, token="t1").add("run_id IN (?, ?)", "a", "b")
    assert where.sql() == " WHERE id > ? AND token = ? AND run_id IN (?, ?)"
    assert where.params == [7, "t1", "a", "b"]


def test_a_falsy_value_other_than_none_still_filters():
    where = Where().equal(shard="", count=0)
    assert where.sql() == " WHERE shard = ? AND count = ?"
    assert where.params == ["", 0]
