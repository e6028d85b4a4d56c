"""Write the real photographs shipped as package data (vit_deploy/data/photos/).

    python scripts/make_photos.py SOURCE...

SOURCE: the registry packages the photographs are taken from, as downloaded files:
scikit-image's and scikit-learn's wheels (`pip download --no-deps scikit-image
scikit-learn`) and Debian bookworm's packages (`apt-get download gcompris-qt-data=3.1-2
lomiri-wallpapers-16.04=20.04.0-2 lomiri-wallpapers-20.04=20.04.0-2
palapeli-data=4:22.12.3-1`); matplotlib's sample photograph comes from the installed
matplotlib. Only the photographs of the sources given are (re)written; SOURCES.md lists
all of them. GCompris keeps its pictures inside Qt resource files (`.rcc`), read here.

Every photograph is public domain, CC0, CC BY or CC BY-SA (the licence, author and
source of each are recorded in photos/SOURCES.md, which this script writes). Each is
resized so its longer side is at most 448 pixels (Pillow, Lanczos) and saved as an 8-bit
RGB JPEG, quality 90 (grey photographs as RGB). Deterministic for the same inputs.
"""

from __future__ import annotations

import io
import struct
import sys
import tarfile
import zipfile
import zlib
from pathlib import Path

from PIL import Image

OUT = Path(__file__).resolve().parents[1] / "vit_deploy" / "data" / "photos"
LONG_SIDE = 448
# what a photograph shows, for SOURCES.md; those of NOT_ORDINARY do not count among the
# ordinary photographs a verdict must represent (grey, microscopy, astronomy, medical)
NOT_ORDINARY = ("grey", "microscopy", "astronomy", "medical")

# name -> (source, member, role, what it shows, category, licence). role: "calib"
# photographs are what quantisation calibrates on by default, "eval" ones are held out and
# judge: no photograph is in both. A GCompris member is "RESOURCE_FILE.rcc:PATH_INSIDE".
PHOTOS = {
    "astronaut": ("skimage", "skimage/data/astronaut.png", "calib",
                  "Eileen Collins, NASA portrait", "people", "public domain (NASA)"),
    "coffee": ("skimage", "skimage/data/coffee.png", "calib", "a cup of coffee", "food",
               "CC0 (photographer Rachel Michetti)"),
    "rocket": ("skimage", "skimage/data/rocket.jpg", "calib", "Falcon 9 launch of DSCOVR",
               "objects", "public domain (SpaceX)"),
    "china": ("sklearn", "sklearn/datasets/images/china.jpg", "calib", "a temple in China",
              "landscape", "CC BY 2.0, danielbuechele (Flickr), as shipped by scikit-learn"),
    "camera": ("skimage", "skimage/data/camera.png", "calib", "a man with a camera (grey)",
               "grey", "CC0 (photographer Lav Varshney)"),
    "ihc": ("skimage", "skimage/data/ihc.png", "calib", "immunohistochemistry micrograph",
            "microscopy", "no known copyright restrictions (CMMI)"),
    "chelsea": ("skimage", "skimage/data/chelsea.png", "eval", "Chelsea the cat", "animals",
                "CC0 (photographer Stefan van der Walt)"),
    "hopper": ("matplotlib", "grace_hopper.jpg", "eval", "Grace Hopper, U.S. Navy portrait",
               "people", "public domain (U.S. federal government)"),
    "flower": ("sklearn", "sklearn/datasets/images/flower.jpg", "eval", "a flower", "close-up",
               "CC BY 2.0, vultilion (Flickr), as shipped by scikit-learn"),
    "hubble": ("skimage", "skimage/data/hubble_deep_field.jpg", "eval", "Hubble deep field",
               "astronomy", "public domain (NASA)"),
    "retina": ("skimage", "skimage/data/retina.jpg", "eval", "fundus photograph of an eye",
               "medical", "CC0 (Wikimedia Commons, Mikael Häggström)"),
    "coins": ("skimage", "skimage/data/coins.png", "eval", "Greek coins from Pompeii (grey)",
              "grey", "no known copyright restrictions (Brooklyn Museum)"),
    'band-room': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/explore_world_music.rcc:gcompris/src/activities/explore_world_music/resource/music/america.webp', 'calib',
        'drum kit and guitars in a room', 'interior',
        'CC-BY 2.0, Tom Harpel, https://commons.wikimedia.org/wiki/File:Onalaska-Practice6.jpg'),
    'opera-singers': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/explore_world_music.rcc:gcompris/src/activities/explore_world_music/resource/music/italy.webp', 'calib',
        'costumed singers/performers', 'people',
        'CC0-1.0, SoriamuséuM, https://commons.wikimedia.org/wiki/File:%C3%93pera_c%C3%A1sina.jpg'),
    'hens': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/explore_farm_animals.rcc:gcompris/src/activities/explore_farm_animals/resource/animals/chicken.webp', 'calib',
        'hens on grass', 'animals',
        'Public Domain, Tranquilles, https://commons.wikimedia.org/wiki/File:Chickens_at_Tranquilles_B%26B.JPG'),
    'horses': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/explore_farm_animals.rcc:gcompris/src/activities/explore_farm_animals/resource/animals/horse.webp', 'calib',
        'herd of horses', 'animals',
        'CC0-1.0, Seth Zeigler, https://commons.wikimedia.org/wiki/File:Nokota_Horse_Stud_Band.jpg'),
    'camels': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/erase.rcc:gcompris/src/activities/erase/resource/camels.webp', 'calib',
        'Bactrian camels in steppe', 'animals',
        'CC-BY-SA-4.0, Alexandr frolov, https://commons.wikimedia.org/wiki/File:Camelus_bactrianus_in_western_Mongolia_02.jpg (cropping, sharpening)'),
    'cutlery': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/categorization.rcc:gcompris/src/activities/categorization/resource/images/others/knife.webp', 'calib',
        'knife, fork and spoon', 'objects',
        'Public Domain, Perblo, https://commons.wikimedia.org/wiki/File:Folke_Arstrom_Facette.jpg'),
    'igloo': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/categorization.rcc:gcompris/src/activities/categorization/resource/images/others/igloo.webp', 'calib',
        'igloo in snow', 'landscape',
        'CC0-1.0, Estormiz, https://commons.wikimedia.org/wiki/File:Igloo_Cafe_Oulu_20180330_02.jpg'),
    'dam': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/categorization.rcc:gcompris/src/activities/categorization/resource/images/renewable/dam1.webp', 'calib',
        'dam spillway in forest', 'landscape',
        'Public Domain, Damsuki, https://commons.wikimedia.org/wiki/File:Amagasedam-d6ebeb2d.JPG'),
    'solar-oven': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/categorization.rcc:gcompris/src/activities/categorization/resource/images/renewable/solar2.webp', 'calib',
        'bread baking in solar oven', 'food',
        'CC0-1.0, Ljubica Šaran, https://commons.wikimedia.org/wiki/File:Sun%C4%8Deva_pe%C4%87nica.jpg'),
    'arc-carrousel': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/categorization.rcc:gcompris/src/activities/categorization/resource/images/monuments/arcDeTriomphe.webp', 'calib',
        'Arc du Carrousel with pedestrians', 'street',
        'Public Domain, Markus Mark, https://commons.wikimedia.org/wiki/File:Arc_de_Triomphe_du_Carrousel,_Paris_May_2009_001.jpg'),
    'number-blocks': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/categorization.rcc:gcompris/src/activities/categorization/resource/images/numbers/numbers.webp', 'calib',
        'wooden 1-2-3 number blocks', 'text',
        'CC-BY-SA 4.0, Divyam Madaan'),
    'trier-street': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/explore_monuments.rcc:gcompris/src/activities/explore_monuments/resource/germany/aulaPalatina.webp', 'calib',
        'Aula Palatina, Trier, street with parked cars', 'street',
        'Public Domain, Berthold Werner, https://commons.wikimedia.org/wiki/File:Trier_Konstantinbasilika_BW_1.JPG'),
    'sydney-night': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/details.rcc:gcompris/src/activities/details/resource/image/OperaSidney_background.webp', 'calib',
        'Sydney Opera House and skyline at night', 'night',
        'CC-BY-SA 4.0, 2000, 2008 Bruno Coudoin and others (based on a photo by David Iliff, license CC-BY-SA 3.0, source at https://commons.wikimedia.org/wiki/File:Sydney_Opera_House_-_Dec_2008.jpg)'),
    'bridge-cables': ('lomiri-wallpapers-16.04', 'usr/share/backgrounds/Bridge_by_Sander_Klootwijk.jpg', 'calib',
        'bridge cables against sky and beach', 'landscape',
        'CC-BY-SA-4.0, 2018. Sander Klootwijk'),
    'drums': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/explore_world_music.rcc:gcompris/src/activities/explore_world_music/resource/music/africa.webp', 'eval',
        'bata drums on grass', 'objects',
        'Public Domain, Kenneth Ritchards, https://commons.wikimedia.org/wiki/File:Bata_drums.jpg'),
    'didgeridoo': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/explore_world_music.rcc:gcompris/src/activities/explore_world_music/resource/music/australia.webp', 'eval',
        'Aboriginal man playing didgeridoo', 'people',
        'CC-BY 2.0, Steve Evans, https://commons.wikimedia.org/wiki/File:Australia_Aboriginal_Culture_009.jpg'),
    'folk-band': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/explore_world_music.rcc:gcompris/src/activities/explore_world_music/resource/music/ireland.webp', 'eval',
        'folk band on stage', 'people',
        'CC-BY 2.0, candyschwartz, https://commons.wikimedia.org/wiki/File:Lunny_irvine_o_flynn_glackin.jpg'),
    'night-festival': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/explore_world_music.rcc:gcompris/src/activities/explore_world_music/resource/music/japan.webp', 'eval',
        'night festival with drums and lanterns', 'night',
        'Public Domain, takami torao, https://commons.wikimedia.org/wiki/File:Agidaiko03.jpg'),
    'mariachi': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/explore_world_music.rcc:gcompris/src/activities/explore_world_music/resource/music/mexico.webp', 'eval',
        'mariachi musicians', 'people',
        'CC0-1.0, Elidealista, https://commons.wikimedia.org/wiki/File:Wikipedia_10_Guadalajara_-_Mariachi.jpg'),
    'orchestra': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/explore_world_music.rcc:gcompris/src/activities/explore_world_music/resource/music/orchestra.webp', 'eval',
        'orchestra in concert hall', 'people',
        'Public Domain, ABC Informática, https://commons.wikimedia.org/wiki/File:Orchestra_of_the_18th_Century.jpg'),
    'louvre-dusk': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/details.rcc:gcompris/src/activities/details/resource/image/Louvre_2007_02_24_c_background.webp', 'eval',
        'Louvre pyramid at dusk', 'night',
        'CC-BY-SA 4.0, 2000, 2008 Bruno Coudoin and others (based on a photo by Benh LIEU SONG, license CC-BY-SA 3.0, source at https://commons.wikimedia.org/wiki/File:Louvre_2007_02_24_c.jpg)'),
    'notre-dame-night': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/details.rcc:gcompris/src/activities/details/resource/image/NDP_background.webp', 'eval',
        'Notre-Dame de Paris facade lit at night', 'night',
        'CC-BY-SA 4.0, 2000, 2008 Bruno Coudoin and others (based on a photo by Sanchezn, license CC-BY-SA 3.0, source at https://commons.wikimedia.org/wiki/File:NotreDameDeParis.jpg)'),
    'tower-bridge-night': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/details.rcc:gcompris/src/activities/details/resource/image/TowerBridgeLondon_background.webp', 'eval',
        'Tower Bridge at night', 'night',
        'CC-BY-SA 4.0, 2000, 2008 Bruno Coudoin and others (based on a photo by David Iliff, license CC-BY-SA 4.0, source at https://commons.wikimedia.org/wiki/File:Tower_Bridge_London_Feb_2006.jpg)'),
    'eilean-donan': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/details.rcc:gcompris/src/activities/details/resource/image/EilanDonanCastle_background.webp', 'eval',
        'castle on loch, mountains', 'landscape',
        'CC-BY 4.0, 2000, 2008 Bruno Coudoin and others (based on a photo by Guillaume Piolle, license CC-BY 3.0, source at https://commons.wikimedia.org/wiki/File:Eilean_Donan_castle_-_95mm.jpg)'),
    'coral-reef': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/clickgame.rcc:gcompris/src/activities/clickgame/resource/sea3.webp', 'eval',
        'coral reef underwater', 'animals',
        'Public Domain, SolarSurfer, https://commons.wikimedia.org/wiki/File:Finding_Nemo_Porthole.JPG'),
    'kitten-wool': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/explore_farm_animals.rcc:gcompris/src/activities/explore_farm_animals/resource/animals/cat.webp', 'eval',
        'kitten playing with wool on red blanket', 'animals',
        'Public Domain, Loliloli, https://commons.wikimedia.org/wiki/File:Spielendes_K%C3%A4tzchen.JPG'),
    'cow': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/explore_farm_animals.rcc:gcompris/src/activities/explore_farm_animals/resource/animals/cow.webp', 'eval',
        'Holstein cow in field', 'animals',
        'Public Domain, Dohduhdah, https://commons.wikimedia.org/wiki/File:Cow-IMG_2050.JPG'),
    'shepherd-dog': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/explore_farm_animals.rcc:gcompris/src/activities/explore_farm_animals/resource/animals/dog.webp', 'eval',
        'German shepherd dog', 'animals',
        'Public Domain, Hans Kemperman, https://commons.wikimedia.org/wiki/File:German-shepherd-4040871920._(2).jpg'),
    'cheetah': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/erase.rcc:gcompris/src/activities/erase/resource/cheetah.webp', 'eval',
        'cheetah lying in grass', 'animals',
        'CC-BY-SA-4.0, Charles J. Sharp, https://commons.wikimedia.org/wiki/File:Cheetah_(Acinonyx_jubatus)_female_2.jpg (cropping, sharpening)'),
    'red-panda': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/erase.rcc:gcompris/src/activities/erase/resource/red_panda.webp', 'eval',
        'red panda on branch', 'animals',
        'CC0-1.0, Mathias Appel, https://commons.wikimedia.org/wiki/File:Red_Panda_(30324056733).jpg (cropping, sharpening)'),
    'kingfisher': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/erase.rcc:gcompris/src/activities/erase/resource/kingfisher.webp', 'eval',
        'kingfisher on branch', 'animals',
        'CC0-1.0, Frank-2.0, https://commons.wikimedia.org/wiki/File:Eisvogel_kingfisher.jpg (cropping, sharpening)'),
    'light-bulb': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/categorization.rcc:gcompris/src/activities/categorization/resource/images/others/bulb.webp', 'eval',
        'LED light bulb', 'objects',
        'CC0-1.0, Vitaium, https://commons.wikimedia.org/wiki/File:Philips_LED_bulb.jpg'),
    'chair': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/categorization.rcc:gcompris/src/activities/categorization/resource/images/others/chair.webp', 'eval',
        'white wooden chair', 'objects',
        'Public Domain, Pierre Gencey, https://commons.wikimedia.org/wiki/File:Gabriel_00.jpg'),
    'frying-pan': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/categorization.rcc:gcompris/src/activities/categorization/resource/images/others/pan.webp', 'eval',
        'frying pan on kitchen counter', 'objects',
        'Public Domain, Suricata, https://commons.wikimedia.org/wiki/File:Pfanne_(Gusseisen).jpg'),
    'teacup': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/categorization.rcc:gcompris/src/activities/categorization/resource/images/others/cup.webp', 'eval',
        'cup and saucer', 'objects',
        'Public Domain, FA2010, https://commons.wikimedia.org/wiki/File:Fermanagh_cup_makffm_13817.jpg'),
    'lab-scale': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/categorization.rcc:gcompris/src/activities/categorization/resource/images/others/weighingMachine.webp', 'eval',
        'digital lab scale with labelled buttons', 'objects',
        'Public Domain, Karelj, https://commons.wikimedia.org/wiki/File:Balance_Scaltec.jpg'),
    'tape-measure': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/categorization.rcc:gcompris/src/activities/categorization/resource/images/tools/measuringTape5.webp', 'eval',
        'metal tape measure with numbers', 'objects',
        'CC0-1.0, Junior Libby, https://publicdomainpictures.net/en/view-image.php?image=26532&picture=tape-measure'),
    'windmills': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/categorization.rcc:gcompris/src/activities/categorization/resource/images/renewable/windmill13.webp', 'eval',
        'Dutch windmills by canal', 'landscape',
        'CC0-1.0, Alf van Beem, https://commons.wikimedia.org/wiki/File:Dutch_windmill_at_Kinderdijk_pic43.JPG'),
    'clownfish': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/categorization.rcc:gcompris/src/activities/categorization/resource/images/fishes/fish9.webp', 'eval',
        'clownfish in anemone', 'animals',
        'Public Domain, Jan Derk, https://commons.wikimedia.org/wiki/File:Common_clownfish.jpg'),
    'new-york-street': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/categorization.rcc:gcompris/src/activities/categorization/resource/images/monuments/empireState.webp', 'eval',
        'Empire State Building between buildings', 'street',
        'CC0-1.0, Alex Liivet, https://commons.wikimedia.org/wiki/File:New_York_2007_(24636948519).jpg'),
    'winter-palace-night': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/categorization.rcc:gcompris/src/activities/categorization/resource/images/monuments/zimniPalace.webp', 'eval',
        'Winter Palace lit at night', 'night',
        'Public Domain, AndreyA, https://commons.wikimedia.org/wiki/File:WinterPalactNight-center.jpg'),
    'letter-blocks': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/categorization.rcc:gcompris/src/activities/categorization/resource/images/alphabets/alphabets.webp', 'eval',
        'wooden ABC letter blocks', 'text',
        'CC-BY-SA 4.0, Divyam Madaan'),
    'gateway-of-india': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/explore_monuments.rcc:gcompris/src/activities/explore_monuments/resource/india/gatewayofIndia.webp', 'eval',
        'Gateway of India at dusk, people, palm trees', 'night',
        'CC0-1.0, Simon Steinberger, https://commons.wikimedia.org/wiki/File:Gateway-of-India.jpg'),
    'mont-saint-michel': ('gcompris-qt-data', 'usr/share/gcompris-qt/rcc/explore_monuments.rcc:gcompris/src/activities/explore_monuments/resource/france/montStMichel.webp', 'eval',
        'Mont-Saint-Michel across tidal flats', 'landscape',
        'CC0-1.0, Ali Sabbagh, https://commons.wikimedia.org/wiki/File:Mont_Saint-Michel_IMG_5109_(48875955288).jpg'),
    'mountain-meadow': ('lomiri-wallpapers-16.04', 'usr/share/backgrounds/aitzgorri_by_Aitzol_Berasategi.jpg', 'eval',
        'autumn mountain meadow', 'landscape',
        'CC-BY-4.0, Aitzol Berasategi, 2018'),
    'leaves-sky': ('lomiri-wallpapers-16.04', 'usr/share/backgrounds/Dragonfly_by_Bolly.jpg', 'eval',
        'leafy branch against sky', 'close-up',
        'CC-BY-SA-4.0, "Bolly", 2018'),
    'ceiling-lamps': ('lomiri-wallpapers-16.04', 'usr/share/backgrounds/free_by_Peter_Nerlich.jpg', 'eval',
        'bird figurine hanging under ceiling lamps', 'interior',
        'CC-BY-SA-4.0, Peter Nerlich, 2018'),
    'spaniels': ('lomiri-wallpapers-16.04', 'usr/share/backgrounds/friends_by_Aitzol_Berasategi.jpg', 'eval',
        'two spaniels looking out of a wooden house', 'animals',
        'CC-BY-4.0, Aitzol Berasategi, 2018'),
    'wall-clock': ('lomiri-wallpapers-16.04', 'usr/share/backgrounds/greentock_by_Peter_Nerlich.jpg', 'eval',
        'wall clock face close-up', 'objects',
        'CC-BY-SA-4.0, Peter Nerlich, 2018'),
    'mountain-path': ('lomiri-wallpapers-16.04', 'usr/share/backgrounds/picosdeeuropa_by_Aitzol_Berasategi.jpg', 'eval',
        'Picos de Europa mountain path', 'landscape',
        'CC-BY-4.0, Aitzol Berasategi, 2018'),
    'fig-bowl': ('lomiri-wallpapers-16.04', 'usr/share/backgrounds/Picture_0B_by_freespace.jpg', 'eval',
        'halved fig in red bowl', 'food',
        'CC-BY-4.0, Trevor "Freespace", 2018'),
    'paint-brushes': ('lomiri-wallpapers-16.04', 'usr/share/backgrounds/Picture_1A_by_freespace.jpg', 'eval',
        'paint brushes', 'objects',
        'CC-BY-4.0, Trevor "Freespace", 2018'),
    'sunset-hills': ('lomiri-wallpapers-16.04', 'usr/share/backgrounds/sunset_by_Aitzol_Berasategi.jpg', 'eval',
        'sunset over hills', 'landscape',
        'CC-BY-4.0, Aitzol Berasategi, 2018'),
    'wine-room': ('lomiri-wallpapers-16.04', 'usr/share/backgrounds/Wine_by_Jakkub_Mede.jpg', 'eval',
        'room with wine bottle, glass, drum and chair', 'interior',
        'CC-BY-4.0, Jakub Mede, 2018'),
    'nuthatch': ('lomiri-wallpapers-20.04', 'usr/share/backgrounds/Kleiber_by_Lukas_Baubkus.jpg', 'eval',
        'nuthatch (Kleiber) on tree trunk', 'animals',
        'CC-BY-SA-3.0, 2021, Lukas Baubkus'),
    'bridge-night': ('palapeli-data', 'usr/share/palapeli/collection/cincinnati-bridge.jpg', 'eval',
        'Roebling suspension bridge at night', 'night',
        "public domain (Derek Jensen; the picture's own .desktop file)"),
    'citrus': ('palapeli-data', 'usr/share/palapeli/collection/citrus-fruits.jpg', 'eval',
        'sliced citrus fruits', 'food',
        "public domain (US Department of Agriculture; the picture's own .desktop file)"),
    'honey-bee': ('palapeli-data', 'usr/share/palapeli/collection/european-honey-bee.jpg', 'eval',
        'honey bee on aster', 'animals',
        "public domain (John Severns; the picture's own .desktop file)"),
}


def source_of(path: Path) -> str:
    """Which source a downloaded file is, by its name (a wheel or a Debian package)."""
    name = path.name
    for prefix, source in (("scikit_image-", "skimage"), ("scikit-image-", "skimage"),
                           ("scikit_learn-", "sklearn"), ("scikit-learn-", "sklearn")):
        if name.startswith(prefix):
            return source
    if name.endswith(".deb"):
        return name.split("_", 1)[0]
    raise SystemExit(f"not a source this script knows: {name} (expected the scikit-image or "
                     f"scikit-learn wheel, or a .deb of {sorted(DEBIAN)})")


DEBIAN = {"gcompris-qt-data", "lomiri-wallpapers-16.04", "lomiri-wallpapers-20.04",
          "palapeli-data"}


def deb_member(deb: Path, member: str) -> bytes:
    """One file of a Debian package: an ar archive holding data.tar.* ."""
    blob = deb.read_bytes()
    if blob[:8] != b"!<arch>\n":
        raise SystemExit(f"{deb}: not a Debian package (no ar header)")
    at = 8
    while at + 60 <= len(blob):
        header = blob[at:at + 60]
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
        body = blob[at + 60:at + 60 + size]
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(body)) as tar:
                return tar.extractfile("./" + member).read()
        at += 60 + size + (size % 2)
    raise SystemExit(f"{deb}: no data.tar member")


def rcc_member(blob: bytes, wanted: str) -> bytes:
    """One file of a Qt resource file (rcc format 1-3: a tree of entries, names in
    UTF-16, data stored raw or zlib-compressed)."""
    if blob[:4] != b"qres":
        raise SystemExit("not a Qt resource file")
    version, tree, data, names = struct.unpack(">IIII", blob[4:20])
    entry = 14 if version == 1 else 22

    def name(offset: int) -> str:
        n = struct.unpack(">H", blob[names + offset:names + offset + 2])[0]
        return blob[names + offset + 6:names + offset + 6 + 2 * n].decode("utf-16-be")

    def walk(index: int, prefix: str) -> bytes | None:
        at = tree + index * entry
        offset, flags = struct.unpack(">IH", blob[at:at + 6])
        path = f"{prefix}/{name(offset)}" if index else ""
        if flags & 2:  # a directory: its children
            count, first = struct.unpack(">II", blob[at + 6:at + 14])
            for child in range(first, first + count):
                found = walk(child, path)
                if found is not None:
                    return found
            return None
        if path.lstrip("/") != wanted:
            return None
        start = struct.unpack(">I", blob[at + 10:at + 14])[0]
        size = struct.unpack(">I", blob[data + start:data + start + 4])[0]
        raw = blob[data + start + 4:data + start + 4 + size]
        if flags & 4:
            raise SystemExit(f"{wanted}: zstd-compressed in its resource file")
        return zlib.decompress(raw[4:]) if flags & 1 else raw

    found = walk(0, "")
    if found is None:
        raise SystemExit(f"{wanted}: not in its resource file")
    return found


def read(source: str, member: str, files: dict[str, Path]) -> Image.Image:
    if source == "matplotlib":
        from matplotlib import cbook

        return Image.open(cbook.get_sample_data(member, asfileobj=False))
    if source in DEBIAN:
        inner = None
        if ":" in member:  # GCompris: a file inside a Qt resource file
            member, inner = member.split(":", 1)
        blob = deb_member(files[source], member)
        return Image.open(io.BytesIO(rcc_member(blob, inner) if inner else blob))
    with zipfile.ZipFile(files[source]) as z:
        return Image.open(io.BytesIO(z.read(member)))


def main(*sources: str) -> None:
    files = {source_of(Path(s)): Path(s) for s in sources}
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, (source, member, role, what, category, licence) in PHOTOS.items():
        path = OUT / f"{role}-{name}.jpg"
        if source in files or source == "matplotlib" and "skimage" in files:
            image = read(source, member, files).convert("RGB")
            scale = LONG_SIDE / max(image.size)
            if scale < 1:
                image = image.resize((round(image.width * scale), round(image.height * scale)),
                                     Image.Resampling.LANCZOS)
            image.save(path, quality=90)
        with Image.open(path) as image:
            size = image.size
        package = {"skimage": "scikit-image (PyPI)", "sklearn": "scikit-learn (PyPI)",
                   "matplotlib": "matplotlib (PyPI)"}.get(source, f"{source} (Debian)")
        rows.append(f"| `{path.name}` | {size[0]}×{size[1]} | {what} | {category} | "
                    f"{package}: `{member}` | {licence} |")
    ordinary = sum(p[4] not in NOT_ORDINARY for p in PHOTOS.values())
    (OUT / "SOURCES.md").write_text(
        "# Real photographs shipped with vit-deploy\n\n"
        "Written by `scripts/make_photos.py`. `calib-*` photographs are the default "
        "calibration set of `quantize`; `eval-*` ones are held out and judge every precision "
        "(`quantize`, `--max-drop`) by default. No photograph is in both sets. "
        f"{ordinary} of the {len(PHOTOS)} are ordinary photographs (the rest: "
        f"{', '.join(NOT_ORDINARY)}), from {len({p[0] for p in PHOTOS.values()})} packages.\n\n"
        "| file | size | what | kind | taken from | licence |\n|---|---|---|---|---|---|\n"
        + "\n".join(rows) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(*sys.argv[1:])
