import pytest

from vit_deploy.runtime.sizes import require_patch_multiple, nearest_valid_sizes, parse_resolution


@pytest.mark.parametrize("text,hw", [("448", (448, 448)), ("320x480", (320, 480)),
                                     (" 32 X 64 ", (32, 64)), (224, (224, 224))])
def test_parse_resolution(text, hw):
    assert parse_resolution(text) == hw


@pytest.mark.parametrize("text", ["0", "-16", "abc", "16x", "x16", "16x16x3", "1.5", ""])
def test_parse_resolution_rejects(text):
    with pytest.raises(ValueError, match="resolution must be"):
        parse_resolution(text)


def test_nearest_valid_sizes():
    assert nearest_valid_sizes(230, 16) == (224, 240)
    assert nearest_valid_sizes(224, 16) == (224,)
    assert nearest_valid_sizes(5, 16) == (16,)


def test_check_input_size_message_names_size_patch_and_neighbours():
    with pytest.raises(ValueError, match=r"input width 230 .* patch size 16; nearest valid "
                                         r"sizes: 224 or 240"):
        require_patch_multiple(224, 230, 16)
