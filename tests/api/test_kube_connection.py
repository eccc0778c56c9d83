from batchd.api.kube_connection import ApiError


def test_a_status_object_gives_its_message_and_reason() -> None:
    body = b'{"kind":"Status","message":"pods \\"x\\" not found","reason":"NotFound"}'
    error = ApiError.of_answer(404, body)
    assert (error.status, error.reason, error.message) == (404, "NotFound", 'pods "x" not found')
    assert str(error) == '404 NotFound: pods "x" not found'


def test_a_body_that_is_no_status_object_is_the_message() -> None:
    assert ApiError.of_answer(502, b"bad gateway").message == "bad gateway"
    assert ApiError.of_answer(500, b"[1]").message == "[1]"
